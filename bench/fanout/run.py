"""Benchmark: a 50,000-user role changes permissions; time until Kafka acknowledged all.

Measured as an operator would see it: the service runs as its own processes, once as the
chart deploys it (`worker --no-relay` and `relay`) and once as one `worker` process with
the relay in a thread; the clock starts when set-role-permissions commits and stops when
the relays have deleted the last outbox row (a row is deleted only after the broker
acknowledged it). Its limit, measured in the same run on the same rows: the database's
floor, ONE statement building every snapshot of the role (the JSON payload the worker
writes per user) with its result fetched. Target: the chart's default topology (two
workers, two relays; the role is two shards) within 2x of it; one worker with one relay and
the relay in the worker's process are measured beside it.

With `--baseline REV [REV ...]` the service of each git revision REV (its `identity_fanout`
package first on its processes' PYTHONPATH, on a database of its own migrated by REV's own
migrations and seeded alike) fans out the same role in the chart's topology too, in turn
with this checkout's for `--rounds` rounds: each side's figure (commit -> last row deleted)
is printed round by round with its min / median / max, so a difference is judged against
the code it replaces in the same run and against the rounds' spread. The permission change
itself is this checkout's (the clock starts at its commit).

Then runs the 1,000,000-user scale-out benchmark (`scale.py`) unless `--scale-users 0`, the
same with every worker and relay process limited to `--cpu-limit` millicores (1, 2, 4 and
8 instances, as pods with a CPU limit) unless `--limited-scale-users 0`, and the revocation
latency under a 1,000,000-user fan-out (`latency.py`, with the same baselines) unless
`--latency-users 0`.

    uv run python bench/fanout/run.py [--users 50000] [--batch-size 500] [--scale-users N]
        [--limited-scale-users N] [--cpu-limit 50] [--latency-users N]
        [--baseline REV ...] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple
from uuid import UUID

import latency
import procs
import psycopg
import scale
from rich.table import Table

from identity_fanout.fanout.enqueue import set_role_permissions
from pin_testkit.bench import (
    Comparison,
    Figure,
    baseline_packages,
    busy_share,
    machine_jiffies,
    record,
)
from pin_testkit.runtime_roles import runtime_dsn
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.waiting import wait_until

BENCHMARK: Final = "identity-fanout: {users:,}-user role, commit -> last event acked"
TARGET: Final = 2.0
"""The chart's topology at most this many times the database's floor."""

# How the service runs: the chart's default is two fan-out workers and two relays, each its
# own pod (the relay a Deployment of its own, `relay.separateDeployment`); one of each is
# the smallest such topology; `worker` alone runs the relay in a thread of the worker.
# Workers are listed before relays' pairs so that processes[0] is a worker, [1] a relay.
CHART: Final = "chart default (2 workers, 2 relays)"
TOPOLOGIES: Final[dict[str, list[tuple[str, ...]]]] = {
    CHART: [procs.WORKER, procs.RELAY, procs.WORKER, procs.RELAY],
    "1 worker + 1 relay": [procs.WORKER, procs.RELAY],
    "relay in the worker (one process)": [("worker",)],
}
# Each measurement changes the role's permissions anew: the set alternates between these.
PERMISSION_SETS: Final = (["bench.read", "bench.write"], ["bench.read"])

# The floor: every user's snapshot payload as the worker builds it (queries.SNAPSHOT_ROWS
# aggregated per user, the fields and wire names of UserAccessChangedKafkaEvent's payload,
# CompanyId from the user's assignment of the role), for every user of the role at once.
SNAPSHOTS_OF_ROLE: Final = """
SELECT a.user_id, json_build_object(
    'UserId', a.user_id,
    'CompanyId', coalesce(
        (array_agg(a.company_id ORDER BY a.id)
            FILTER (WHERE a.role_id = %(role_id)s AND a.company_id IS NOT NULL))[1],
        %(company_id)s::uuid),
    'ChangeReason', 'RolePermissionsChanged',
    'ActiveAssignments', json_agg(json_build_object(
        'AssignmentId', a.id, 'RoleId', a.role_id, 'RoleCode', r.code,
        'ScopeType', a.scope_type, 'ScopeOrganizationId', a.scope_organization_id,
        'ScopeProjectGroupId', a.scope_project_group_id, 'ScopeProjectId', a.scope_project_id,
        'ExpiresAt', a.expires_at) ORDER BY a.id),
    'Version', %(version)s::bigint)::text
FROM identity.role_assignments AS a
JOIN identity.role_definitions AS r ON r.id = a.role_id
WHERE a.user_id IN (
        SELECT user_id FROM identity.role_assignments
        WHERE role_id = %(role_id)s AND status = 'Active')
  AND a.status = 'Active'
  AND (a.expires_at IS NULL OR a.expires_at > now())
GROUP BY a.user_id
"""
FLOOR_RUNS: Final = 3
ROUNDS: Final = 3
"""Rounds of each side with `--baseline`."""


class Timings(NamedTuple):
    enqueue_ms: float
    completed_s: float
    acknowledged_s: float
    worker_rss_mib: float
    relay_rss_mib: float | None
    machine_busy: float
    load: float


def seed(dsn: str, users: int) -> UUID:
    with procs.console.status(f"seeding a role of {users:,} users"), psycopg.connect(dsn) as db:
        role, _ = seed_role_with_users(db, users=users, other_roles=2)
        # Other roles and users too, so the role is not the whole table.
        seed_role_with_users(db, users=users // 2, other_roles=1, code="bystanders")
        add_permissions(db, ["bench.read", "bench.write"])
        db.commit()
        db.autocommit = True  # VACUUM refuses to run in a transaction block
        db.execute("VACUUM ANALYZE identity.role_assignments")
    return role


def floor_seconds(dsn: str, role: UUID, users: int) -> list[float]:
    """Seconds of the one statement building every snapshot of the role, result fetched."""
    times = []
    with psycopg.connect(runtime_dsn(dsn, "identity_fanout_worker"), autocommit=True) as db:
        company, version = db.execute(
            "SELECT company_id, version FROM identity.role_definitions WHERE id = %s", (role,)
        ).fetchone() or (None, 1)
        for _ in range(FLOOR_RUNS):
            started = time.monotonic()
            rows = db.execute(
                SNAPSHOTS_OF_ROLE, {"role_id": role, "company_id": company, "version": version}
            ).fetchall()
            times.append(time.monotonic() - started)
            if len(rows) != users:
                raise RuntimeError(f"the floor built {len(rows)} snapshots, not {users}")
    return times


def measure(
    dsn: str,
    bootstrap: str,
    role: UUID,
    *,
    users: int,
    batch_size: int,
    commands: list[tuple[str, ...]],
    run: int,
    package: str | None = None,
) -> Timings:
    """One fan-out of the role by `commands`' processes: this checkout's service, or with
    `package` a baseline's. `run` counts the role's changes in this database (each sets
    other permissions than the one before it)."""
    env = {
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": bootstrap,
        "IDENTITY_FANOUT_BATCH_SIZE": str(batch_size),
    }
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("VACUUM identity.outbox")  # each run starts from the same outbox
    with (
        procs.launched(dsn, commands, env, package) as processes,
        psycopg.connect(runtime_dsn(dsn, "identity_fanout_operator"), autocommit=True) as db,
    ):
        machine = machine_jiffies()
        started = time.monotonic()
        change = set_role_permissions(db, role, PERMISSION_SETS[run % 2], inline_threshold=1000)
        committed = time.monotonic()
        if change.task_id is None:
            raise RuntimeError(f"expected a queued task, got {change.mode}")

        task_id = change.task_id
        done = "the task completed"
        wait_until(lambda: procs.task_completed(db, task_id), 600, done, interval=0.02)
        completed = time.monotonic()
        # The relays' counters, scraped every 20 ms: a count(*) of the outbox that often
        # would load the database the relay reads from.
        wait_until(
            lambda: procs.published(processes) >= users, 600, "every event published", interval=0.02
        )
        acknowledged = time.monotonic()
        busy = busy_share(machine, machine_jiffies())
        if db.execute("SELECT count(*) FROM identity.outbox").fetchone() != (0,):
            raise RuntimeError("the relay reported more rows than it deleted")
        return Timings(
            enqueue_ms=(committed - started) * 1000,
            completed_s=completed - committed,
            acknowledged_s=acknowledged - committed,
            worker_rss_mib=procs.peak_rss_mib(processes[0].pid),
            relay_rss_mib=procs.peak_rss_mib(processes[1].pid) if len(processes) > 1 else None,
            machine_busy=busy,
            load=os.getloadavg()[0],
        )


class Database(NamedTuple):
    """A side's database: its service, the role it fans out, the changes made of it so far."""

    side: procs.Side
    dsn: str
    role: UUID
    changes: int = 0


def rounds_side_by_side(
    admin_dsn: str,
    bootstrap: str,
    this: Database,
    revisions: Sequence[str],
    *,
    users: int,
    batch_size: int,
    rounds: int,
) -> dict[str, list[Timings]]:
    """The chart's topology, this checkout's service (in `this`) and that of each git revision
    (in a database its own migrations made, seeded alike) in turn, `rounds` times: each
    side's timings, round by round."""
    with contextlib.ExitStack() as stack:
        baselines = stack.enter_context(baseline_packages(revisions))
        databases = [this]
        for side in procs.sides(baselines)[1:]:
            dsn = stack.enter_context(
                procs.scratch_database(admin_dsn, "pin_bench_fanout", side.package)
            )
            databases.append(Database(side, dsn, seed(dsn, users)))
        timings: dict[str, list[Timings]] = {d.side.name: [] for d in databases}
        for round_ in range(rounds):
            for d in procs.rotated(databases, round_):
                with procs.console.status(f"round {round_ + 1}: {d.side.name}, {CHART}"):
                    timings[d.side.name].append(
                        measure(
                            d.dsn,
                            bootstrap,
                            d.role,
                            users=users,
                            batch_size=batch_size,
                            commands=TOPOLOGIES[CHART],
                            run=d.changes + round_,
                            package=d.side.package,
                        )
                    )
    return timings


def report_sides(users: int, timings: dict[str, list[Timings]]) -> None:
    """Each side's figures round by round, their spread, and the medians' ratio."""
    names = list(timings)
    rounds = len(timings[procs.THIS_CHECKOUT])
    table = Table(
        title=f"identity-fanout: a {users:,}-user role, {CHART}: this checkout and each "
        f"baseline in turn, {rounds} rounds ({os.cpu_count()} cores shared with PostgreSQL "
        "and Kafka)",
        title_justify="left",
    )
    table.add_column("measure")
    for name in names:
        table.add_column(name, justify="right")
    completed = {n: [t.completed_s for t in ts] for n, ts in timings.items()}
    acked = {n: [t.acknowledged_s for t in ts] for n, ts in timings.items()}
    this = acked[procs.THIS_CHECKOUT]

    def row(measure: str, cell: Callable[[str], str]) -> None:
        table.add_row(measure, *(cell(n) for n in names))

    row("commit -> task Completed, s, each round", lambda n: procs.each_round(completed[n]))
    row("  min / median / max", lambda n: procs.spread(completed[n]))
    row("commit -> last event acked, s, each round", lambda n: procs.each_round(acked[n]))
    row("  min / median / max", lambda n: procs.spread(acked[n]))
    row("  median / this checkout's", lambda n: procs.versus(acked[n], this))
    row(
        "worker peak RSS MiB, each round",
        lambda n: procs.each_round([t.worker_rss_mib for t in timings[n]], 0),
    )
    row(
        "machine CPU busy, each round",
        lambda n: ", ".join(f"{t.machine_busy:.0%}" for t in timings[n]),
    )
    procs.console.print(table)


def report(users: int, batch_size: int, results: dict[str, Timings], floor: list[float]) -> None:
    table = Table(
        title=f"identity-fanout: permissions of a {users:,}-user role change -> Kafka "
        f"(BatchSize {batch_size}; {os.cpu_count()} cores shared with PostgreSQL and Kafka)",
        title_justify="left",
    )
    table.add_column("measure")
    for name in results:
        table.add_column(name, justify="right")
    table.add_column("limit / target", justify="right")

    def row(measure: str, values: list[str], target: str = "") -> None:
        table.add_row(measure, *values, target)

    best_floor = min(floor)
    timings = list(results.values())
    row("set-role-permissions commit", [f"{t.enqueue_ms:.0f} ms" for t in timings])
    row("commit -> task Completed", [f"{t.completed_s:.2f} s" for t in timings])
    row(
        "commit -> last event acked by Kafka",
        [f"{t.acknowledged_s:.2f} s" for t in timings],
        f"floor {best_floor:.2f} s (one statement, best of {len(floor)}: "
        + ", ".join(f"{f:.2f}" for f in floor)
        + ")",
    )
    row(
        "  / the database's floor",
        [f"{t.acknowledged_s / best_floor:.2f}x" for t in timings],
        f"<= {TARGET:g}x (chart default)",
    )
    row("throughput", [f"{users / t.acknowledged_s:,.0f} users/s" for t in timings])
    row("worker peak RSS", [f"{t.worker_rss_mib:.0f} MiB" for t in timings])
    row(
        "relay peak RSS",
        [f"{t.relay_rss_mib:.0f} MiB" if t.relay_rss_mib else "(in the worker)" for t in timings],
    )
    row("machine CPU busy (anyone's work)", [f"{t.machine_busy:.0%}" for t in timings])
    row("load average (1 min) at the end", [f"{t.load:.1f}" for t in timings])
    procs.console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument(
        "--scale-users",
        type=int,
        default=scale.USERS,
        help="users of the scale-out benchmark's role (0: do not run it)",
    )
    parser.add_argument(
        "--limited-scale-users",
        type=int,
        default=scale.USERS,
        help="users of the scale-out with a CPU limit per process (0: do not run it)",
    )
    parser.add_argument(
        "--cpu-limit",
        type=int,
        default=scale.POD_MILLICORES,
        metavar="MILLICORES",
        help="the CPU limit per worker and relay process of that scale-out",
    )
    parser.add_argument(
        "--latency-users",
        type=int,
        default=latency.USERS,
        help="users of the large role the latency benchmark fans out meanwhile (0: skip it)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        nargs="*",
        default=[],
        help="also fan out with the service of each of these git revisions, in turn "
        "(here and in the latency benchmark)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help="rounds of each side with --baseline (the chart's topology)",
    )
    args = parser.parse_args()

    admin_dsn, bootstrap = procs.services()
    compared: dict[str, list[Timings]] = {}
    with procs.scratch_database(admin_dsn, "pin_bench_fanout") as dsn:
        role = seed(dsn, args.users)
        with procs.console.status("the floor: one statement building every snapshot"):
            floor = floor_seconds(dsn, role, args.users)
        results = {}
        for run, (name, commands) in enumerate(TOPOLOGIES.items()):
            with procs.console.status(f"fan-out, {name}"):
                results[name] = measure(
                    dsn,
                    bootstrap,
                    role,
                    users=args.users,
                    batch_size=args.batch_size,
                    commands=commands,
                    run=run,
                )
        if args.baseline:
            compared = rounds_side_by_side(
                admin_dsn,
                bootstrap,
                Database(procs.Side(procs.THIS_CHECKOUT), dsn, role, len(TOPOLOGIES)),
                args.baseline,
                users=args.users,
                batch_size=args.batch_size,
                rounds=args.rounds,
            )
    report(args.users, args.batch_size, results, floor)
    if compared:
        report_sides(args.users, compared)
    record(
        Comparison.duration(
            BENCHMARK.format(users=args.users),
            Figure("2 workers + 2 relays (chart default)", results[CHART].acknowledged_s),
            Figure("one SQL statement building every snapshot", min(floor)),
            target=TARGET,
        )
    )
    if args.scale_users:
        scale.run(scale.Options(users=args.scale_users, batch_size=args.batch_size))
    if args.limited_scale_users:
        scale.run(
            scale.Options(
                users=args.limited_scale_users,
                batch_size=args.batch_size,
                instances=scale.LIMITED_INSTANCES,
                cpu_limit=args.cpu_limit,
            )
        )
    if args.latency_users:
        scenarios = latency.run(args.latency_users, latency.RELAY_MILLICORES, args.baseline)
        latency.report_all(args.latency_users, scenarios)


if __name__ == "__main__":
    main()
