"""The chaos schedule is pure: a seed replays it; every kind of fault appears in a long one."""

from __future__ import annotations

import pytest
from pin_e2e.chaos.faults import DEPENDENCIES, FaultKind, schedule

PROCESSES = {
    "worker-1": DEPENDENCIES,
    "worker-2": DEPENDENCIES,
    "relay-1": DEPENDENCIES,
    "consumer-1": DEPENDENCIES,
    "access-cache": ("kafka",),
}


def test_the_same_seed_replays_the_same_schedule_and_another_seed_does_not() -> None:
    first = schedule(1234, 50, PROCESSES, span=300)
    assert first == schedule(1234, 50, PROCESSES, span=300)
    assert first != schedule(1235, 50, PROCESSES, span=300)


def test_a_long_schedule_has_every_kind_in_order_within_its_span() -> None:
    faults = schedule(7, 50, PROCESSES, span=300)
    assert len(faults) == 50
    assert {f.kind for f in faults} == set(FaultKind)
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert all(0 <= f.at <= 300 for f in faults)
    assert [f.number for f in faults] == list(range(1, 51))


def test_network_faults_cut_only_a_path_the_process_has() -> None:
    for seed in range(20):
        for fault in schedule(seed, 30, PROCESSES, span=100):
            if fault.dependency is not None:
                assert fault.dependency in PROCESSES[fault.target]


def test_an_empty_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one fault"):
        schedule(1, 0, PROCESSES, span=10)
