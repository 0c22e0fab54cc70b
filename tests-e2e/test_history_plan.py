"""The outbox history's plan is pure: a seed replays it; every kind of fault is in a short
one; the fleet never drops below two relays for a fault, never grows past its limit, and
the relay without pg_read_all_stats that starts with the run is never taken away."""

from __future__ import annotations

import random

from pin_e2e.history.plan import (
    MAX_RELAYS,
    MIN_RELAYS,
    QUIET_EDGE,
    ActionKind,
    Plan,
    late_commit,
    schedule,
)

SHORT = 40.0


def test_the_same_seed_replays_the_same_plan_and_another_seed_does_not() -> None:
    assert schedule(1234, SHORT) == schedule(1234, SHORT)
    assert schedule(1234, SHORT) != schedule(1235, SHORT)


def test_a_short_plan_has_every_kind_of_fault() -> None:
    for seed in range(300):
        kinds = {a.kind for a in schedule(seed, SHORT).actions}
        assert kinds == set(ActionKind), seed


def _fleet_sizes(plan: Plan) -> list[tuple[float, ActionKind, int]]:
    """(when, what, relays running just before) for each relay action."""
    running = {spec.label for spec in plan.relays}
    back: list[tuple[float, str]] = []
    sizes = []
    for action in plan.actions:
        if action.relay is None:
            continue
        running |= {label for at, label in back if at <= action.at}
        back = [(at, label) for at, label in back if at > action.at]
        sizes.append((action.at, action.kind, len(running) + len(back)))
        if action.kind is ActionKind.JOIN:
            running.add(action.relay.label)
        else:
            running.discard(action.relay.label)
            if action.kind is ActionKind.KILL:
                back.append((action.at + action.hold, action.relay.label))
    return sizes


def test_faults_keep_a_relay_running_and_the_fleet_small() -> None:
    for seed in range(300):
        plan = schedule(seed, 120.0)
        kept = next(spec for spec in plan.relays if not spec.reads_statistics)
        for action in plan.actions:
            if action.kind in (ActionKind.KILL, ActionKind.LEAVE):
                assert action.relay != kept, seed
        for _, kind, size in _fleet_sizes(plan):
            assert size <= MAX_RELAYS, seed
            if kind is not ActionKind.JOIN:
                assert size >= MIN_RELAYS, seed


def test_faults_stay_inside_the_load_and_held_transactions_end_in_it() -> None:
    for seed in range(100):
        plan = schedule(seed, SHORT)
        for action in plan.actions:
            assert QUIET_EDGE <= action.at <= SHORT - QUIET_EDGE, (seed, action)
            if action.relay is None:
                assert action.at + action.hold <= SHORT - QUIET_EDGE + 0.01, (seed, action)


def test_a_longer_plan_has_more_faults() -> None:
    assert len(schedule(7, 600.0).actions) > 4 * len(schedule(7, SHORT).actions)


def test_both_kinds_of_relay_login_run_from_the_start() -> None:
    plan = schedule(3, SHORT)
    assert sorted(spec.reads_statistics for spec in plan.relays) == [False, True]


def test_late_commits_are_mostly_prompt_and_some_seconds_late() -> None:
    rng = random.Random(5)
    waits = [late_commit(rng) for _ in range(4000)]
    assert all(0.0 <= w <= 3.0 for w in waits)
    assert 0.3 < sum(w <= 0.02 for w in waits) / len(waits) < 0.5
    assert 0.2 < sum(w >= 1.0 for w in waits) / len(waits) < 0.3
