"""Benchmark: how late a revocation gets while a huge role is being fanned out.

Two point-of-view figures, each measured on an idle system and while a 1,000,000-user role is
fanned out by 2 workers and 2 relays (the chart's topology, each process as its runtime
login), then again with each relay limited to 100m of CPU as a pod's `resources.limits.cpu`
would (a cgroup v1 `cpu` controller group per relay with a CFS quota):

- a task: a 600-user role above the inline threshold changes permissions; enqueue -> task
  Completed (the worker's fair claim decides how long it waits behind the large role's shards);
- an inline change: a 50-user role changes permissions; commit -> every event acknowledged by
  Kafka (the relay deletes a row only after its acknowledgement; backpressure decides how many
  rows it waits behind).

Targets: the task within 10 s and the inline change within 3 s, whatever the large role's
size. Each figure is taken three times in a row during the fan-out; the worst one counts.

    uv run python bench/fanout/latency.py [--users 1000000] [--relay-millicores 100]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Final, NamedTuple
from uuid import UUID

import procs
import psycopg
import scale
from rich.table import Table

from identity_fanout.fanout.enqueue import set_role_permissions
from pin_testkit.bench import Comparison, Figure, record
from pin_testkit.runtime_roles import runtime_dsn
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.service import ServiceProcess
from pin_testkit.waiting import wait_until

USERS: Final = 1_000_000
TASK_USERS: Final = 600
INLINE_USERS: Final = 50
TASK_INLINE_THRESHOLD: Final = 500
"""The task's role is above it (a queued task); the inline role below the service default."""
TASK_TARGET: Final = 10.0
INLINE_TARGET: Final = 3.0
SAMPLES: Final = 3
LOADED_AFTER: Final = 50_000
"""Events the fan-out has published before the loaded samples start: the outbox is full."""
RELAY_MILLICORES: Final = 100
"""A relay pod's CPU limit in the limited scenario."""

Conn = psycopg.Connection[tuple[object, ...]]


class Sample(NamedTuple):
    task_s: float
    inline_s: float


class Scenario(NamedTuple):
    name: str
    samples: list[Sample]
    fanout_running: bool
    """The large role's task was still InProgress when the last sample ended."""


def seed(dsn: str, users: int) -> tuple[UUID, UUID, UUID, list[UUID]]:
    """The large role (3 assignments per user, seeded set-based), the task's role and the
    inline role (and its users)."""
    with procs.console.status(f"seeding a role of {users:,} users"), psycopg.connect(dsn) as db:
        large = scale.seed_role(db, users, "latency")
        task_role, _ = seed_role_with_users(db, users=TASK_USERS, other_roles=1, code="task")
        inline_role, inline_users = seed_role_with_users(
            db, users=INLINE_USERS, other_roles=1, code="inline"
        )
        add_permissions(db, ["latency.a", "latency.b", *scale.PERMISSION_SETS[0]])
        db.commit()
        db.autocommit = True
        db.execute("VACUUM ANALYZE identity.role_assignments")
    return large, task_role, inline_role, list(inline_users)


class Probe:
    """One change of each small role, timed from its commit."""

    def __init__(self, db: Conn, task_role: UUID, inline_role: UUID, inline_users: list[UUID]):
        self._db = db
        self._task_role = task_role
        self._inline_role = inline_role
        self._keys = [str(u) for u in inline_users]
        self._turns: dict[UUID, int] = {}

    def _permissions(self, role: UUID) -> list[str]:
        """Each change of a role differs from its previous one (an identical set is no change)."""
        turn = self._turns[role] = self._turns.get(role, 0) + 1
        return ["latency.a"] if turn % 2 else ["latency.a", "latency.b"]

    def task_seconds(self) -> float:
        change = set_role_permissions(
            self._db,
            self._task_role,
            self._permissions(self._task_role),
            inline_threshold=TASK_INLINE_THRESHOLD,
        )
        committed = time.monotonic()
        if change.task_id is None:
            raise RuntimeError(f"expected a queued task, got {change.mode}")
        task_id = change.task_id
        wait_until(lambda: procs.task_completed(self._db, task_id), 300, "task", interval=0.02)
        return time.monotonic() - committed

    def inline_seconds(self) -> float:
        change = set_role_permissions(
            self._db, self._inline_role, self._permissions(self._inline_role), inline_threshold=1000
        )
        committed = time.monotonic()
        if change.mode != "inline":
            raise RuntimeError(f"expected an inline change, got {change.mode}")
        wait_until(self._inline_published, 300, "inline events acked", interval=0.02)
        return time.monotonic() - committed

    def _inline_published(self) -> bool:
        row = self._db.execute(
            "SELECT count(*) FROM identity.outbox WHERE message_key = ANY(%s)", (self._keys,)
        ).fetchone()
        return row == (0,)

    def samples(self) -> list[Sample]:
        return [Sample(self.task_seconds(), self.inline_seconds()) for _ in range(SAMPLES)]


def _running(db: Conn, task_id: UUID) -> bool:
    row = db.execute(
        "SELECT status FROM identity.access_fanout_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    return row == ("InProgress",)


def _loaded(
    name: str, db: Conn, *, probe: Probe, large: UUID, relays: list[ServiceProcess], turn: int
) -> Scenario:
    """Start the large role's fan-out, wait until it is well under way, take the samples."""
    before = procs.published(relays)
    change = set_role_permissions(db, large, scale.PERMISSION_SETS[turn % 2], inline_threshold=1000)
    if change.task_id is None:
        raise RuntimeError(f"expected a queued task, got {change.mode}")
    task_id = change.task_id
    wait_until(
        lambda: procs.published(relays) - before >= LOADED_AFTER,
        600,
        "the fan-out under way",
        interval=0.1,
    )
    samples = probe.samples()
    return Scenario(name, samples, _running(db, task_id))


def run(users: int, millicores: int) -> list[Scenario]:
    admin_dsn, bootstrap = procs.services()
    env = {"IDENTITY_FANOUT_KAFKA_BOOTSTRAP": bootstrap}
    commands = [procs.WORKER, procs.WORKER, procs.RELAY, procs.RELAY]
    scenarios: list[Scenario] = []
    with procs.scratch_database(admin_dsn, "pin_bench_latency") as dsn:
        large, task_role, inline_role, inline_users = seed(dsn, users)
        with (
            procs.launched(dsn, commands, env) as processes,
            psycopg.connect(runtime_dsn(dsn, "identity_fanout_operator"), autocommit=True) as db,
        ):
            relays = processes[2:]
            wait_until(lambda: scale.relays_settled(db, 2), 60, "relays hold their lanes")
            probe = Probe(db, task_role, inline_role, inline_users)
            with procs.console.status("idle system"):
                scenarios.append(Scenario("idle system", probe.samples(), fanout_running=False))
            with procs.console.status(f"during a {users:,}-user fan-out"):
                scenarios.append(
                    _loaded(
                        "2 workers + 2 relays, no CPU limit",
                        db,
                        probe=probe,
                        large=large,
                        relays=relays,
                        turn=0,
                    )
                )
            with procs.console.status("waiting for that fan-out to finish"):
                wait_until(lambda: _idle(db), 1800, "the fan-out finished", interval=0.5)
            with procs.cpu_limited([r.pid for r in relays], millicores) as limited:
                if limited:
                    with procs.console.status(f"during a fan-out, relays at {millicores}m"):
                        scenarios.append(
                            _loaded(
                                f"2 workers + 2 relays at {millicores}m CPU each",
                                db,
                                probe=probe,
                                large=large,
                                relays=relays,
                                turn=1,
                            )
                        )
    return scenarios


def _idle(db: Conn) -> bool:
    tasks = db.execute(
        "SELECT count(*) FROM identity.access_fanout_tasks "
        "WHERE status IN ('Pending', 'InProgress')"
    ).fetchone()
    rows = db.execute("SELECT count(*) FROM identity.outbox").fetchone()
    return tasks == (0,) and rows == (0,)


def report(users: int, scenarios: list[Scenario]) -> None:
    table = Table(
        title=f"identity-fanout: revocation latency while a {users:,}-user role is fanned out "
        f"(worst of {SAMPLES}; {os.cpu_count()} cores shared with PostgreSQL and Kafka)",
        title_justify="left",
    )
    for column in (
        "scenario",
        f"{TASK_USERS}-user task: enqueue -> Completed",
        f"{INLINE_USERS}-user inline change: commit -> acked",
        "fan-out still running",
    ):
        table.add_column(column, justify="right")
    for s in scenarios:
        table.add_row(
            s.name,
            " / ".join(f"{x.task_s:.2f}" for x in s.samples) + " s",
            " / ".join(f"{x.inline_s:.2f}" for x in s.samples) + " s",
            "yes" if s.fanout_running else ("-" if s.name == "idle system" else "NO"),
        )
    table.add_row("target", f"<= {TASK_TARGET:g} s", f"<= {INLINE_TARGET:g} s", "")
    procs.console.print(table)


def record_all(users: int, scenarios: list[Scenario]) -> None:
    idle = scenarios[0]
    for s in scenarios[1:]:
        figures = (
            (f"{TASK_USERS}-user task, enqueue -> Completed", TASK_TARGET, 0),
            (f"{INLINE_USERS}-user inline change, commit -> acked", INLINE_TARGET, 1),
        )
        for what, target, column in figures:
            worst = max(x[column] for x in s.samples)
            idle_worst = max(x[column] for x in idle.samples)
            record(
                Comparison.duration(
                    f"identity-fanout: {what} during a {users:,}-user fan-out",
                    Figure(s.name, worst),
                    Figure("target", target),
                    target=1.0,
                    note=f"idle system: {idle_worst:.2f} s"
                    + ("" if s.fanout_running else "; the fan-out ended before the samples"),
                )
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--relay-millicores", type=int, default=RELAY_MILLICORES)
    args = parser.parse_args()
    scenarios = run(args.users, args.relay_millicores)
    report(args.users, scenarios)
    record_all(args.users, scenarios)


if __name__ == "__main__":
    main()
