"""The seeded plan of a history run: its writers and their choices, the relays and what
happens to them, the transactions held beside the writers.

Pure: the same seed and length give the same plan (`schedule`), so a failing run is played
again with its printed seed. The seed fixes every choice (which key, how late a commit,
which relay is killed when); the threads' interleaving is the machine's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

__all__ = [
    "FAULT_EVERY",
    "Action",
    "ActionKind",
    "Plan",
    "RelaySpec",
    "WriterSpec",
    "late_commit",
    "schedule",
]

FAULT_EVERY: Final = 7.0
"""Seconds of load per relay fault, on average."""
HELD_EVERY: Final = 25.0
"""Seconds of load per held transaction of each kind, on average."""
MAX_RELAYS: Final = 3
"""Relay processes at once at most: two shared cores also run the servers and the writers."""
MIN_RELAYS: Final = 2
"""A relay is killed or stopped only while another runs: its lanes are taken over at the
next look, so a fault never leaves the outbox without a publisher."""
QUIET_EDGE: Final = 3.0
"""No fault in the first and last seconds of the load."""


class ActionKind(StrEnum):
    KILL = "relay SIGKILL (restarted)"
    JOIN = "relay started (lanes move to it)"
    LEAVE = "relay stopped (SIGTERM, its lanes move)"
    UNRELATED_PREPARED = "unrelated prepared transaction held"
    LONG_TRANSACTION = "long transaction holding a transaction id"


@dataclass(frozen=True, slots=True)
class RelaySpec:
    label: str
    reads_statistics: bool
    """Logs in as the relay's role (a member of pg_read_all_stats) or as a login with the
    relay's grants and without it."""

    def describe(self) -> str:
        return f"{self.label} ({'with' if self.reads_statistics else 'without'} pg_read_all_stats)"


@dataclass(frozen=True, slots=True)
class Action:
    at: float
    """Seconds after the load started."""
    kind: ActionKind
    relay: RelaySpec | None = None
    hold: float = 0.0
    """How long the held transaction is held; for a kill, how long until the restart."""

    def describe(self) -> str:
        target = f" {self.relay.describe()}" if self.relay else ""
        held = f" for {self.hold:.1f}s" if self.hold else ""
        return f"{self.kind.value}{target}{held}"


@dataclass(frozen=True, slots=True)
class WriterSpec:
    """One writer thread: what it writes and its own seed."""

    name: str
    kind: str
    """A `model.WriterKind` value."""
    seed: str


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    seconds: float
    """How long the writers write."""
    relays: tuple[RelaySpec, ...]
    """Running when the load starts."""
    actions: tuple[Action, ...]
    writers: tuple[WriterSpec, ...]
    serialized_keys: tuple[str, ...]
    unserialized_keys: tuple[str, ...]
    flood_keys: tuple[str, ...]
    flood_rate: float
    """Rows a second of each flood writer."""
    fanout_users: tuple[str, ...]
    """The users a fan-out burst writes rows of."""
    fanout_rows: tuple[int, int]
    """Rows of one fan-out burst (distinct users, in slot order, one transaction: the
    shape of the worker's page statement)."""
    fanout_every: float
    """Seconds between a flood writer's fan-out bursts, on average; none in the last
    quarter of the load. The relays drain each over many reads with records in flight,
    reading on after their lanes' cursors (docs/design/identity-fanout.md "Outbox relay":
    the drain of a large backlog)."""


def late_commit(rng: random.Random) -> float:
    """How long a late writer waits between its INSERT and its commit: two in five commit
    at once, one in three within 0.8 s, one in four 1-3 s later."""
    draw = rng.random()
    if draw < 0.4:
        return rng.uniform(0.0, 0.02)
    return rng.uniform(0.0, 0.8) if draw < 0.75 else rng.uniform(1.0, 3.0)


def schedule(seed: int, seconds: float) -> Plan:
    """The plan of a run of `seconds` of load: every kind of fault at least once."""
    rng = random.Random(seed)
    relays = (RelaySpec("relay-1", True), RelaySpec("relay-2", False))
    faults = max(3, round(seconds / FAULT_EVERY))
    span = max(1.0, seconds - 2 * QUIET_EDGE)
    times = sorted(QUIET_EDGE + rng.uniform(0, span) for _ in range(faults))
    actions = _relay_actions(rng, relays, times)
    held = max(1, round(seconds / HELD_EVERY))
    for kind in (ActionKind.UNRELATED_PREPARED, ActionKind.LONG_TRANSACTION):
        for _ in range(held):
            hold = rng.uniform(4.0, min(15.0, max(5.0, seconds / 3)))
            at = QUIET_EDGE + rng.uniform(0, max(0.0, seconds - 2 * QUIET_EDGE - hold))
            actions.append(Action(round(at, 2), kind, hold=round(hold, 2)))
    writers = (
        *(WriterSpec(f"ser-{i}", "serialized", f"{seed}:ser-{i}") for i in range(4)),
        *(WriterSpec(f"hot-{i}", "unserialized", f"{seed}:hot-{i}") for i in range(3)),
        *(WriterSpec(f"flood-{i}", "flood", f"{seed}:flood-{i}") for i in range(2)),
        WriterSpec("prep-0", "prepared", f"{seed}:prep-0"),
    )
    return Plan(
        seed=seed,
        seconds=seconds,
        relays=relays,
        actions=tuple(sorted(actions, key=lambda a: a.at)),  # stable: drawn order kept
        writers=writers,
        serialized_keys=tuple(f"ser-{seed}-{i}" for i in range(4)),
        unserialized_keys=tuple(f"hot-{seed}-{i}" for i in range(3)),
        flood_keys=tuple(f"flood-{seed}-{i}" for i in range(400)),
        flood_rate=30.0,
        fanout_users=tuple(f"user-{seed}-{i}" for i in range(1500)),
        fanout_rows=(500, 1500),
        fanout_every=15.0,
    )


def _relay_actions(
    rng: random.Random, initial: tuple[RelaySpec, ...], times: list[float]
) -> list[Action]:
    """A relay fault at each of `times`, each one the fleet allows then (a kill or a stop
    only while another relay runs, a start only below `MAX_RELAYS`), a kind not played yet
    first: three faults play all three kinds. The first relay without pg_read_all_stats
    runs throughout: what its floor does to late rows shows the longer it holds lanes."""
    kept = next((spec for spec in initial if not spec.reads_statistics), None)
    running = list(initial)
    started = len(initial)
    restarts: list[tuple[float, RelaySpec]] = []
    played: set[ActionKind] = set()
    actions: list[Action] = []
    for at in times:
        # A killed relay is back after its restart delay.
        running += [spec for when, spec in restarts if when <= at]
        restarts = [(when, spec) for when, spec in restarts if when > at]
        victims = [spec for spec in running if spec != kept]
        allowed = [
            kind
            for kind, ok in (
                (ActionKind.KILL, len(running) >= MIN_RELAYS and bool(victims)),
                (ActionKind.LEAVE, len(running) >= MIN_RELAYS and bool(victims)),
                (ActionKind.JOIN, len(running) + len(restarts) < MAX_RELAYS),
            )
            if ok
        ]
        if not allowed:
            continue
        kind = rng.choice([k for k in allowed if k not in played] or allowed)
        played.add(kind)
        if kind is ActionKind.JOIN:
            started += 1
            spec = RelaySpec(f"relay-{started}", rng.random() < 0.5)
            running.append(spec)
            actions.append(Action(round(at, 2), kind, spec))
            continue
        spec = rng.choice(victims)
        running.remove(spec)
        hold = 0.0
        if kind is ActionKind.KILL:
            hold = round(rng.uniform(0.5, 2.0), 2)
            restarts.append((at + hold, spec))
        actions.append(Action(round(at, 2), kind, spec, hold=hold))
    return actions
