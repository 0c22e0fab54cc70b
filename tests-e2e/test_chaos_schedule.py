"""The chaos schedule is pure: a seed replays it; every kind of fault appears in a long one;
the long faults follow each other, each long enough to page."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from pin_e2e.chaos.faults import (
    DEPENDENCIES,
    HELD_FAULTS,
    HELD_SNAPSHOT_SECONDS,
    LONG_FAULTS,
    LONG_GAP,
    PAGES,
    SHORT_FAULTS,
    TOPIC_FAULTS,
    FaultKind,
    held_snapshots,
    keeps_firing,
    long_faults,
    pages,
    schedule,
)
from pin_e2e.chaos.rules import SHORTENED, campaign_rule_files

from pin_testkit.local.prometheus import repository_rule_files

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
    assert {f.kind for f in faults} == set(FaultKind) - set(LONG_FAULTS) - set(HELD_FAULTS)
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert all(0 <= f.at <= 300 for f in faults)
    assert [f.number for f in faults] == list(range(1, 51))


@pytest.mark.parametrize("seed", range(0, 1000, 97))
def test_a_campaign_of_one_fault_per_short_kind_plays_every_kind(seed: int) -> None:
    # What `make test`'s campaign draws: its alert matrix sees every kind in every run.
    faults = schedule(seed, len(SHORT_FAULTS), PROCESSES, span=72)
    assert sorted(f.kind for f in faults) == sorted(SHORT_FAULTS)


def test_network_faults_cut_only_a_path_the_process_has() -> None:
    for seed in range(20):
        for fault in schedule(seed, 30, PROCESSES, span=100):
            if fault.dependency is not None:
                assert fault.dependency in PROCESSES[fault.target]


def test_an_empty_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one fault"):
        schedule(1, 0, PROCESSES, span=10)


def test_the_long_faults_follow_each_other_and_outlast_the_alerts_they_must_raise() -> None:
    faults = long_faults(after=400.0, first_number=51)
    assert [f.kind for f in faults] == list(LONG_FAULTS)
    assert [f.number for f in faults] == [51, 52, 53, 54]
    assert faults[0].at == 400.0
    for earlier, later in itertools.pairwise(faults):
        assert later.at == earlier.at + earlier.duration + LONG_GAP
    # Each outlasts its alerts' windows: 6 minutes at least (5m of absence or age + `for`).
    assert all(f.duration >= 6 * 60 for f in faults if pages(f))
    assert set(PAGES) <= set(LONG_FAULTS) | set(TOPIC_FAULTS)
    assert not any(
        pages(f) for f in schedule(3, 50, PROCESSES, span=300) if f.kind not in TOPIC_FAULTS
    )
    assert next(f for f in faults if f.kind is FaultKind.PARTIAL_OUTAGE).duration == 600.0


def test_a_snapshot_is_held_on_each_database_at_once_and_pages_its_own_service() -> None:
    faults = held_snapshots(after=90.0, first_number=11)
    assert [(f.number, f.target, f.at) for f in faults] == [
        (11, "identity", 90.0),
        (12, "rewards", 90.0),
    ]
    assert all(f.duration == HELD_SNAPSHOT_SECONDS for f in faults)
    assert [pages(f) for f in faults] == [
        {"IdentityPostgresHorizonHeld"},
        {"RewardsMembershipPostgresHorizonHeld"},
    ]
    assert faults[0].describe().endswith("on identity 90s")


def test_the_campaign_evaluates_the_horizon_alerts_with_short_windows(tmp_path: Path) -> None:
    files = campaign_rule_files(tmp_path)
    assert {f.name for f in files} == {p.name for p in repository_rule_files()}
    rules = {
        rule["alert"]: rule
        for path in files
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    for alert in SHORTENED:
        assert rules[alert]["expr"].rstrip().endswith("> 20"), rules[alert]["expr"]
        assert rules[alert]["for"] == "15s"
    # The rest are the repository's as they are.
    assert rules["IdentityOutboxBacklogHigh"]["for"] == "5m"
    # Shorter than the fault: the watch's poll (15 s) + threshold + `for` + scraping.
    assert HELD_SNAPSHOT_SECONDS > 15 + 20 + 15 + 10


@pytest.mark.parametrize("seed", range(40))
def test_partitions_are_added_at_most_once_and_page_both_topics_to_the_end(seed: int) -> None:
    faults = schedule(seed, 50, PROCESSES, span=300)
    [grown] = [f for f in faults if f.kind is FaultKind.PARTITIONS_ADDED]
    assert grown.target == "topics"
    assert pages(grown) == {
        "IdentityAccessTopicPartitionsChanged",
        "RewardsMembershipTopicPartitionsChanged",
    }
    # Long enough for the lag watcher's pass and the alerts' 1 minute of `for`.
    assert grown.duration >= 90
    assert keeps_firing(faults) == pages(grown)
    assert keeps_firing([f for f in faults if f is not grown]) == frozenset()
