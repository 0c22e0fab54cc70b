from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pin_runtime.backoff import Backoff


def test_base_doubles_to_the_cap() -> None:
    backoff = Backoff(jitter=0.0)
    assert [backoff.next_delay() for _ in range(9)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff.attempts == 9


def test_reset() -> None:
    backoff = Backoff(jitter=0.0)
    for _ in range(4):
        backoff.next_delay()
    backoff.reset()
    assert (backoff.attempts, backoff.base, backoff.next_delay()) == (0, 1.0, 1.0)


def test_deterministic_with_seeded_rng() -> None:
    first = Backoff(rng=random.Random(7))
    second = Backoff(rng=random.Random(7))
    assert [first.next_delay() for _ in range(10)] == [second.next_delay() for _ in range(10)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": 0},
        {"initial": 2, "maximum": 1},
        {"multiplier": 0.5},
        {"jitter": -0.1},
        {"jitter": 1.5},
    ],
)
def test_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        Backoff(**kwargs)


settings_strategy = st.fixed_dictionaries(
    {
        "initial": st.floats(0.001, 10),
        "extra": st.floats(0, 100),
        "multiplier": st.floats(1, 10),
        "jitter": st.floats(0, 1),
        "seed": st.integers(0, 2**32),
        "steps": st.integers(1, 200),
    }
)


@given(settings_strategy)
def test_delays_stay_within_jittered_base_and_maximum(p: dict[str, float]) -> None:
    maximum = p["initial"] + p["extra"]
    backoff = Backoff(
        initial=p["initial"],
        maximum=maximum,
        multiplier=p["multiplier"],
        jitter=p["jitter"],
        rng=random.Random(p["seed"]),
    )
    previous_base = 0.0
    for _ in range(int(p["steps"])):
        base = backoff.base
        delay = backoff.next_delay()
        assert base >= previous_base  # the schedule never shrinks until reset
        assert base * (1 - p["jitter"]) - 1e-9 <= delay <= base <= maximum
        assert delay >= 0
        previous_base = base


@given(st.integers(0, 300))
def test_unjittered_schedule_is_min_of_power_and_cap(n: int) -> None:
    backoff = Backoff(jitter=0.0)
    delays = [backoff.next_delay() for _ in range(n + 1)]
    assert delays[n] == min(60.0, 2.0**n)
