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

With `--baseline REV [REV ...]` the service of each git revision REV (its `identity_fanout`
package first on its processes' PYTHONPATH, on a database of its own migrated by REV's own
migrations and seeded alike) is measured the same way, in turn with this checkout's for
`--rounds` rounds (2 by default with a baseline, else 1; each round ends with the large
role's fan-out finished when another follows): each figure of each side is printed round
by round (the worst of the round's samples) with its min / median / max. The permission
changes themselves (and the inline change's rows) are this checkout's; the clocks start at
their commits.

    uv run python bench/fanout/latency.py [--users 1000000] [--relay-millicores 100]
        [--baseline REV ...] [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Sequence
from typing import Final, NamedTuple
from uuid import UUID

import procs
import psycopg
import scale
from rich.table import Table

from identity_fanout.fanout.enqueue import set_role_permissions
from pin_testkit.bench import Comparison, Figure, baseline_packages, record
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
BASELINE_ROUNDS: Final = 2
"""Rounds of each side with a baseline, unless told."""
SMALL_SETS: Final = (["latency.a", "latency.b"], ["latency.a"])
"""The permissions of the task's and the inline role, in turn."""

Conn = psycopg.Connection[tuple[object, ...]]


class Sample(NamedTuple):
    task_s: float
    inline_s: float


class Scenario(NamedTuple):
    name: str
    samples: list[Sample]
    fanout_running: bool
    """The large role's task was still InProgress when the last sample ended."""


Results = dict[str, list[list[Scenario]]]
"""Each side's scenarios (by side name, this checkout's first), round by round."""


class Roles(NamedTuple):
    large: UUID
    task: UUID
    inline: UUID
    inline_users: list[UUID]


class Database(NamedTuple):
    """A side's database: its service, its roles, and how often each role changed so far."""

    side: procs.Side
    dsn: str
    roles: Roles
    turns: dict[UUID, int]


def seed(dsn: str, users: int) -> Roles:
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
    return Roles(large, task_role, inline_role, list(inline_users))


class Probe:
    """One change of each small role, timed from its commit."""

    def __init__(self, db: Conn, roles: Roles, turns: dict[UUID, int]):
        self._db = db
        self._task_role = roles.task
        self._inline_role = roles.inline
        self._keys = [str(u) for u in roles.inline_users]
        self._turns = turns

    def permissions(self, role: UUID, sets: tuple[list[str], list[str]] = SMALL_SETS) -> list[str]:
        """Each change of a role differs from its previous one (an identical set is no change):
        `sets` in turn, counted in `turns` (the database's, across rounds)."""
        turn = self._turns[role] = self._turns.get(role, 0) + 1
        return sets[turn % 2]

    def task_seconds(self) -> float:
        change = set_role_permissions(
            self._db,
            self._task_role,
            self.permissions(self._task_role),
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
            self._db, self._inline_role, self.permissions(self._inline_role), inline_threshold=1000
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
    name: str, db: Conn, *, probe: Probe, large: UUID, relays: list[ServiceProcess]
) -> Scenario:
    """Start the large role's fan-out, wait until it is well under way, take the samples."""
    before = procs.published(relays)
    permissions = probe.permissions(large, scale.PERMISSION_SETS)
    change = set_role_permissions(db, large, permissions, inline_threshold=1000)
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


def run(
    users: int, millicores: int, revisions: Sequence[str] = (), rounds: int | None = None
) -> Results:
    """The scenarios of this checkout's service and of that of each git revision, in turn,
    `rounds` times (default: 1 alone, BASELINE_ROUNDS with revisions)."""
    admin_dsn, bootstrap = procs.services()
    rounds = rounds or (BASELINE_ROUNDS if revisions else 1)
    with contextlib.ExitStack() as stack:
        sides = procs.sides(stack.enter_context(baseline_packages(revisions)))
        results: Results = {side.name: [] for side in sides}
        databases = []
        for side in sides:
            dsn = stack.enter_context(
                procs.scratch_database(admin_dsn, "pin_bench_latency", side.package)
            )
            databases.append(Database(side, dsn, seed(dsn, users), {}))
        for round_ in range(rounds):
            for database in procs.rotated(databases, round_):
                results[database.side.name].append(
                    one_round(
                        database,
                        bootstrap,
                        users=users,
                        millicores=millicores,
                        settle=round_ < rounds - 1,
                        label=f"round {round_ + 1}, {database.side.name}: " if rounds > 1 else "",
                    )
                )
    return results


def one_round(
    database: Database, bootstrap: str, *, users: int, millicores: int, settle: bool, label: str
) -> list[Scenario]:
    """One side's scenarios, its processes started for them and stopped after; with `settle`
    the large role's last fan-out is left finished and its outbox vacuumed (another round
    follows on this database)."""
    env = {"IDENTITY_FANOUT_KAFKA_BOOTSTRAP": bootstrap}
    commands = [procs.WORKER, procs.WORKER, procs.RELAY, procs.RELAY]
    found: list[Scenario] = []
    large = database.roles.large
    with (
        procs.launched(database.dsn, commands, env, database.side.package) as processes,
        psycopg.connect(
            runtime_dsn(database.dsn, "identity_fanout_operator"), autocommit=True
        ) as db,
    ):
        relays = processes[2:]
        wait_until(lambda: scale.relays_settled(db, 2), 60, "relays hold their lanes")
        probe = Probe(db, database.roles, database.turns)
        with procs.console.status(f"{label}idle system"):
            found.append(Scenario("idle system", probe.samples(), fanout_running=False))
        with procs.console.status(f"{label}during a {users:,}-user fan-out"):
            found.append(
                _loaded(
                    "2 workers + 2 relays, no CPU limit",
                    db,
                    probe=probe,
                    large=large,
                    relays=relays,
                )
            )
        with procs.console.status(f"{label}waiting for that fan-out to finish"):
            wait_until(lambda: _idle(db), 1800, "the fan-out finished", interval=0.5)
        with procs.cpu_limited([r.pid for r in relays], millicores) as limited:
            if limited:
                with procs.console.status(f"{label}during a fan-out, relays at {millicores}m"):
                    found.append(
                        _loaded(
                            f"2 workers + 2 relays at {millicores}m CPU each",
                            db,
                            probe=probe,
                            large=large,
                            relays=relays,
                        )
                    )
        if settle:
            with procs.console.status(f"{label}waiting for the fan-out to finish"):
                wait_until(lambda: _idle(db), 1800, "the fan-out finished", interval=0.5)
    if settle:
        with psycopg.connect(database.dsn, autocommit=True) as admin:
            admin.execute("VACUUM identity.outbox")
    return found


def _idle(db: Conn) -> bool:
    tasks = db.execute(
        "SELECT count(*) FROM identity.access_fanout_tasks "
        "WHERE status IN ('Pending', 'InProgress')"
    ).fetchone()
    rows = db.execute("SELECT count(*) FROM identity.outbox").fetchone()
    return tasks == (0,) and rows == (0,)


def merged(rounds: list[list[Scenario]]) -> list[Scenario]:
    """A side's rounds as one list of scenarios, each with the samples of every round."""
    by_name: dict[str, Scenario] = {}
    for scenarios in rounds:
        for s in scenarios:
            before = by_name.get(s.name)
            by_name[s.name] = (
                s
                if before is None
                else Scenario(
                    s.name,
                    [*before.samples, *s.samples],
                    before.fanout_running and s.fanout_running,
                )
            )
    return list(by_name.values())


def report(users: int, scenarios: list[Scenario]) -> None:
    table = Table(
        title=f"identity-fanout: revocation latency while a {users:,}-user role is fanned out "
        f"(worst of {len(scenarios[0].samples)}; {os.cpu_count()} cores shared with "
        "PostgreSQL and Kafka)",
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


def report_sides(users: int, results: Results) -> None:
    """Each figure of each side round by round (the worst of the round's samples), their
    spread, and the medians' ratio to this checkout's."""
    names = list(results)
    this = results[procs.THIS_CHECKOUT]
    table = Table(
        title=f"identity-fanout: revocation latency while a {users:,}-user role is fanned out: "
        f"this checkout and each baseline in turn, {len(this)} rounds (a round's figure: the "
        f"worst of its {SAMPLES} samples; {os.cpu_count()} cores shared with PostgreSQL and "
        "Kafka)",
        title_justify="left",
    )
    table.add_column("scenario / measure")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("target", justify="right")

    def rounds_of(name: str, scenario: str) -> list[Scenario]:
        return [s for r in results[name] for s in r if s.name == scenario]

    for scenario in (s.name for s in this[0]):
        table.add_row(f"[bold]{scenario}", *[""] * (len(names) + 1))
        for what, column, target in (
            (f"{TASK_USERS}-user task: enqueue -> Completed", 0, TASK_TARGET),
            (f"{INLINE_USERS}-user inline change: commit -> acked", 1, INLINE_TARGET),
        ):
            worst = [
                [max(x[column] for x in s.samples) for s in rounds_of(n, scenario)] for n in names
            ]
            table.add_row(
                f"  {what}, s, each round", *map(procs.each_round, worst), f"<= {target:g} s"
            )
            table.add_row("    min / median / max", *map(procs.spread, worst), "")
            table.add_row(
                "    median / this checkout's", *(procs.versus(w, worst[0]) for w in worst), ""
            )
        if scenario != this[0][0].name:
            running = [
                ", ".join("yes" if s.fanout_running else "NO" for s in rounds_of(n, scenario))
                for n in names
            ]
            table.add_row("  fan-out still running, each round", *running, "")
    procs.console.print(table)


def report_all(users: int, results: Results) -> None:
    """This checkout's table (the samples of every round) and comparisons, recorded; with
    baselines, every side's figures beside it."""
    this = merged(results[procs.THIS_CHECKOUT])
    report(users, this)
    if len(results) > 1:
        report_sides(users, results)
    record_all(users, this)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--relay-millicores", type=int, default=RELAY_MILLICORES)
    parser.add_argument(
        "--baseline",
        metavar="REV",
        nargs="*",
        default=[],
        help="also measure the service of each of these git revisions, in turn",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds of each side (default: 1, or {BASELINE_ROUNDS} with --baseline)",
    )
    args = parser.parse_args()
    results = run(args.users, args.relay_millicores, args.baseline, args.rounds)
    report_all(args.users, results)


if __name__ == "__main__":
    main()
