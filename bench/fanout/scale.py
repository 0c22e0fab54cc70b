"""Benchmark: a 1,000,000-user role fanned out by 1, 2 and 4 instances of worker + relay.

Each instance is what the chart deploys: one `identity-fanout worker --no-relay` process and
one `identity-fanout relay` process, each as its runtime login. The role (3 active
assignments per user, SHARD_SIZE 25,000: 40 shards) is seeded set-based in the database. The
clock runs from the set-role-permissions commit to the last event acknowledged by Kafka (the
relays' published counters, counted after the DELETE of acknowledged rows, reach the role's
size). Targets on this 2-core machine (PostgreSQL, Kafka and every process share the cores):
2 instances at least 1.3x faster than 1 (duration ratio <= 1/1.3), and worker RSS flat in
role size (peak RSS of one instance on the 1,000,000-user role at most 1.25x its peak on a
role a tenth of the size). 4 instances are shown for information.

With `--cpu-limit M`, every worker and relay process runs in a cgroup with a CPU quota of M
millicores, as a chart's `resources.limits.cpu` gives each pod (PostgreSQL and Kafka stay
unlimited): then the instances do not compete for the machine's two cores and the
scale-out is the service's own. Targets there: 8 instances at least 6.5x faster than 1, and
the CPU per 1,000 users of every component (workers, relays, the broker) at the most
instances at most 1.15x that of 1 instance, PostgreSQL's at most 1.3x. Needs root (the
cgroup v1 `cpu` controller).

    uv run python bench/fanout/scale.py [--users 1000000] [--instances 1 2 4] [--cpu-limit 50]
"""

from __future__ import annotations

import argparse
import math
import os
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Final, NamedTuple
from uuid import UUID

import psycopg
from procs import (
    RELAY,
    WORKER,
    console,
    cpu_limited,
    database_cpu,
    database_cpu_since,
    launched,
    peak_rss_mib,
    published,
    scratch_database,
    services,
    task_completed,
)
from psycopg import sql
from rich.table import Table

from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.outbox.rules import SLOTS
from identity_fanout.schema import OUTBOX_TABLES
from identity_fanout.settings import Settings
from pin_contracts import ScopeType
from pin_testkit.bench import (
    Comparison,
    Figure,
    busy_share,
    cpu_seconds,
    listener_pid,
    machine_jiffies,
    record,
)
from pin_testkit.runtime_roles import runtime_dsn
from pin_testkit.seeding import add_permissions, add_role
from pin_testkit.waiting import wait_until

USERS: Final = 1_000_000
SPEED_UP_TARGET: Final = 1.3
LIMITED_SPEED_UP_TARGETS: Final = {8: 6.5}
"""With a CPU quota per process: the speed-up over 1 instance each instance count must reach."""
CPU_PER_USER_TARGET: Final = 1.15
"""With a CPU quota per process: each component's CPU per user, most instances vs 1."""
CPU_PER_USER_TARGETS: Final = {"PostgreSQL": 1.3}
"""Components held to another limit than CPU_PER_USER_TARGET: PostgreSQL's CPU per user grows
with the server processes and round trips of more instances, which the project's statements
do not decide (bench/RESULTS.md)."""
POD_MILLICORES: Final = 50
LIMITED_INSTANCES: Final = (1, 2, 4, 8)
"""`make bench`'s scale-out with a CPU limit: these instance counts at POD_MILLICORES each."""
RSS_TARGET: Final = 1.25
SMALL_SHARE: Final = 10
"""The RSS comparison's small role holds USERS / SMALL_SHARE users."""
PERMISSION_SETS: Final = (["scale.read", "scale.write"], ["scale.read"])
OTHER_ROLES: Final = 2
LANES: Final = Settings.__struct_defaults__[Settings.__struct_fields__.index("outbox_lanes")]
SHARD_SIZE: Final = Settings.__struct_defaults__[Settings.__struct_fields__.index("shard_size")]

# Every user of a role with OTHER_ROLES more assignments (project-scoped), in one statement:
# ids drawn by the database, no row crosses the wire. MATERIALIZED: the users are drawn once,
# not once per role they are joined with.
SEED_ASSIGNMENTS: Final = """
WITH users AS MATERIALIZED (
    SELECT gen_random_uuid() AS user_id FROM generate_series(1, %(users)s)
)
INSERT INTO identity.role_assignments (id, role_id, user_id, company_id, status, scope_type,
                                       scope_organization_id, scope_project_id)
SELECT gen_random_uuid(), r.role_id, u.user_id, %(company)s, 'Active', r.scope_type,
       CASE WHEN r.scope_type = 'Project' THEN %(company)s::uuid END,
       CASE WHEN r.scope_type = 'Project' THEN gen_random_uuid() END
FROM users AS u
CROSS JOIN unnest(%(roles)s::uuid[], %(scopes)s::text[]) AS r(role_id, scope_type)
"""

# The secondary indexes of role_assignments, dropped for the bulk insert and built again
# after it (one sort each instead of millions of random-order index insertions).
SECONDARY_INDEXES: Final = """
SELECT indexname, indexdef FROM pg_indexes
WHERE schemaname = 'identity' AND tablename = 'role_assignments'
  AND indexname NOT IN (
      SELECT conname FROM pg_constraint WHERE conrelid = 'identity.role_assignments'::regclass)
"""

# Which relay holds which slot of the outbox: settled once every slot is held and each
# instance holds its share (the balancing takes a few seconds after start).
SLOT_HOLDERS: Final = """
SELECT pid, count(*) FROM pg_locks
WHERE locktype = 'advisory' AND classid = %(class)s AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY pid
"""


class Options(NamedTuple):
    users: int = USERS
    batch_size: int = 500
    instances: tuple[int, ...] = (1, 2, 4)
    cpu_limit: int | None = None
    """Millicores per worker and relay process (None: unlimited, the cores are shared)."""


class Result(NamedTuple):
    users: int
    instances: int
    seconds: float
    completed_s: float
    shards: int
    worker_rss_mib: list[float]
    relay_rss_mib: list[float]
    worker_cpu_s: list[float]
    relay_cpu_s: list[float]
    machine_busy: float
    """Share of the whole machine's CPU busy during the run (anyone's work, not only ours)."""
    load: float
    """The machine's 1-minute load average at the end of the run: how many wanted the cores."""
    postgres_cpu_s: float
    """CPU seconds of the PostgreSQL processes working for the benchmark's database."""
    kafka_cpu_s: float | None
    """CPU seconds of the Kafka broker (a local one: also serving anyone else's clients)."""
    machine_cpu_s: float
    """CPU seconds the whole machine was busy (every core, anyone's work)."""


def seed_role(db: psycopg.Connection[tuple[object, ...]], users: int, code: str) -> UUID:
    company = uuid.uuid4()
    role = add_role(db, code, company_id=company, permissions=[f"{code}.read"])
    others = [
        add_role(db, f"{code}-other-{i}", company_id=company, permissions=[f"{code}.other{i}"])
        for i in range(OTHER_ROLES)
    ]
    db.execute(
        SEED_ASSIGNMENTS,
        {
            "users": users,
            "company": company,
            "roles": [role, *others],
            "scopes": [ScopeType.COMPANY.value] + [ScopeType.PROJECT.value] * OTHER_ROLES,
        },
    )
    return role


def seed(dsn: str, users: int) -> tuple[UUID, UUID]:
    """The large role and one of a tenth of its size, 3 active assignments per user."""
    small_users = max(1, users // SMALL_SHARE)
    started = time.monotonic()
    with (
        console.status(f"seeding roles of {users:,} and {small_users:,} users"),
        psycopg.connect(dsn) as db,
    ):
        indexes = db.execute(SECONDARY_INDEXES).fetchall()
        for name, _ in indexes:
            db.execute(sql.SQL("DROP INDEX identity.{}").format(sql.Identifier(str(name))))
        large = seed_role(db, users, "scale")
        small = seed_role(db, small_users, "scale-tenth")
        add_permissions(db, PERMISSION_SETS[0])
        for _, definition in indexes:
            db.execute(sql.SQL(str(definition)))  # pg_indexes' own DDL of the index
        db.commit()
        db.autocommit = True  # VACUUM refuses to run in a transaction block
        db.execute("VACUUM ANALYZE identity.role_assignments")
    console.print(
        f"seeded {(users + small_users) * (1 + OTHER_ROLES):,} assignments "
        f"in {time.monotonic() - started:.1f} s"
    )
    return large, small


def relays_settled(db: psycopg.Connection[tuple[object, ...]], relays: int) -> bool:
    held = [
        int(str(n)) for _, n in db.execute(SLOT_HOLDERS, {"class": OUTBOX_TABLES.lane_lock_class})
    ]
    most = math.ceil(LANES / relays) * SLOTS // LANES
    return len(held) == relays and sum(held) == SLOTS and max(held) <= most


def measure(
    dsn: str,
    bootstrap: str,
    role: UUID,
    *,
    users: int,
    instances: int,
    batch_size: int,
    run: int,
    cpu_limit: int | None = None,
) -> Result:
    env = {
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": bootstrap,
        "IDENTITY_FANOUT_BATCH_SIZE": str(batch_size),
    }
    commands = [WORKER] * instances + [RELAY] * instances
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("VACUUM identity.outbox")  # each run starts from the same outbox
    with (
        launched(dsn, commands, env) as processes,
        psycopg.connect(runtime_dsn(dsn, "identity_fanout_operator"), autocommit=True) as db,
        cpu_limited([p.pid for p in processes], cpu_limit)
        if cpu_limit
        else nullcontext(True) as limited,
    ):
        if not limited:
            raise RuntimeError("--cpu-limit needs the cgroup v1 cpu controller, writable (root)")
        workers, relays = processes[:instances], processes[instances:]
        wait_until(
            lambda: relays_settled(db, instances), 60, "relays hold their lanes", interval=0.2
        )
        cpu = [cpu_seconds(p.pid) for p in processes]
        machine = machine_jiffies()
        dbname = str(db.info.dbname)
        postgres = database_cpu(dbname)
        broker = listener_pid(int(bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)[1]))
        kafka = cpu_seconds(broker) if broker else 0.0
        change = set_role_permissions(db, role, PERMISSION_SETS[run % 2], inline_threshold=1000)
        committed = time.monotonic()
        if change.task_id is None:
            raise RuntimeError(f"expected a queued task, got {change.mode}")

        task_id = change.task_id
        wait_until(lambda: task_completed(db, task_id), 1800, "the task completed")
        completed = time.monotonic()
        wait_until(lambda: published(relays) >= users, 1800, "every event published")
        acknowledged = time.monotonic()
        busy = busy_share(machine, machine_jiffies())
        postgres_cpu = database_cpu_since(dbname, postgres)
        kafka_cpu = cpu_seconds(broker) - kafka if broker else None
        used = [cpu_seconds(p.pid) - before for p, before in zip(processes, cpu, strict=True)]
        shards = db.execute(
            "SELECT shard_count FROM identity.access_fanout_tasks WHERE id = %s",
            (change.task_id,),
        ).fetchone()
        if db.execute("SELECT count(*) FROM identity.outbox").fetchone() != (0,):
            raise RuntimeError("the relays reported more rows than they deleted")
        return Result(
            users=users,
            instances=instances,
            seconds=acknowledged - committed,
            completed_s=completed - committed,
            shards=int(str(shards[0])) if shards else 0,
            worker_rss_mib=[peak_rss_mib(p.pid) for p in workers],
            relay_rss_mib=[peak_rss_mib(p.pid) for p in relays],
            worker_cpu_s=used[:instances],
            relay_cpu_s=used[instances:],
            machine_busy=busy,
            load=os.getloadavg()[0],
            postgres_cpu_s=postgres_cpu,
            kafka_cpu_s=kafka_cpu,
            machine_cpu_s=busy * (os.cpu_count() or 1) * (acknowledged - committed),
        )


def _each(values: list[float], digits: int = 0) -> str:
    """One figure per process, instance by instance."""
    return " / ".join(f"{v:.{digits}f}" for v in values)


def _label(r: Result, small: Result) -> str:
    return f"{r.instances}" + (f" ({r.users:,} users)" if r is small else "")


Cells = dict[str, Callable[[Result], str]]


def _figures(title: str, runs: list[Result], cells: Cells) -> Table:
    """One row per run, one right-aligned column per cell (header -> its figure)."""
    table = Table(title=title, title_justify="left")
    for column in cells:
        table.add_column(column, justify="right")
    for r in runs:
        table.add_row(*(cell(r) for cell in cells.values()))
    return table


def _rest_of_machine(r: Result) -> str:
    """CPU seconds of everything but this run's processes, PostgreSQL and Kafka."""
    ours = sum(r.worker_cpu_s) + sum(r.relay_cpu_s) + r.postgres_cpu_s + (r.kafka_cpu_s or 0)
    return f"{r.machine_cpu_s - ours:.1f}"


def _speed_up_targets(cpu_limit: int | None) -> dict[int, float]:
    return dict(LIMITED_SPEED_UP_TARGETS) if cpu_limit else {2: SPEED_UP_TARGET}


def _per_thousand(cpu_s: float, users: int) -> float:
    return cpu_s * 1000 / users


def _components(r: Result) -> dict[str, float | None]:
    """CPU seconds per 1,000 users of each component of a run."""
    return {
        "workers": _per_thousand(sum(r.worker_cpu_s), r.users),
        "relays": _per_thousand(sum(r.relay_cpu_s), r.users),
        "PostgreSQL": _per_thousand(r.postgres_cpu_s, r.users),
        "Kafka broker": None if r.kafka_cpu_s is None else _per_thousand(r.kafka_cpu_s, r.users),
    }


def report(results: list[Result], small: Result, cpu_limit: int | None = None) -> None:
    base = next(r for r in results if r.instances == 1)
    runs = [small, *results]
    targets = {n: f">= {t:g}x" for n, t in _speed_up_targets(cpu_limit).items()}
    where = (
        f"each process limited to {cpu_limit}m of CPU, PostgreSQL and Kafka unlimited"
        if cpu_limit
        else "shared with PostgreSQL and Kafka"
    )
    title = (
        f"identity-fanout: a {base.users:,}-user role by N instances of worker + relay, "
        f"commit -> last event acked (SHARD_SIZE {SHARD_SIZE:,}, {LANES} lanes; "
        f"{os.cpu_count()} cores, {where})"
    )
    speed: Cells = {
        "instances": lambda r: _label(r, small),
        "shards": lambda r: str(r.shards),
        "commit -> Completed": lambda r: f"{r.completed_s:.1f} s",
        "commit -> last ack": lambda r: f"{r.seconds:.1f} s",
        "users/s": lambda r: f"{r.users / r.seconds:,.0f}",
        "speed-up vs 1": lambda r: "" if r is small else f"{base.seconds / r.seconds:.2f}x",
        "target": lambda r: "" if r is small else targets.get(r.instances, "(information)"),
        "worker peak RSS MiB": lambda r: _each(r.worker_rss_mib),
        "relay peak RSS MiB": lambda r: _each(r.relay_rss_mib),
    }
    console.print(_figures(title, runs, speed))
    ratio = max(base.worker_rss_mib) / max(small.worker_rss_mib)
    console.print(
        f"worker peak RSS, 1 instance: {max(base.worker_rss_mib):.0f} MiB at {base.users:,} "
        f"users vs {max(small.worker_rss_mib):.0f} MiB at {small.users:,}: "
        f"{ratio:.2f}x (target <= {RSS_TARGET:g}x)"
    )
    # Where the cores went during each run: on a shared machine the speed-up is bounded by
    # the CPU left over by everything else, not by the service alone.
    cpu: Cells = {
        "instances": lambda r: _label(r, small),
        "workers": lambda r: _each(r.worker_cpu_s, 1),
        "relays": lambda r: _each(r.relay_cpu_s, 1),
        "PostgreSQL (this database)": lambda r: f"{r.postgres_cpu_s:.1f}",
        "Kafka broker": lambda r: (
            "(not local)" if r.kafka_cpu_s is None else f"{r.kafka_cpu_s:.1f}"
        ),
        "rest of the machine (other work)": _rest_of_machine,
        "machine busy": lambda r: f"{r.machine_busy:.0%} of {os.cpu_count()} cores",
        "load average": lambda r: f"{r.load:.1f}",
    }
    console.print(_figures("CPU seconds during each run", runs, cpu))
    most = max(results, key=lambda r: r.instances)
    per_user: Cells = {"instances": lambda r: str(r.instances)}
    for component in _components(base):
        per_user[f"{component} CPU-s / 1,000 users"] = _per_user_cell(component, base, most)
    console.print(
        _figures(
            f"CPU per 1,000 users by component (vs 1 instance; target at {most.instances}: "
            f"<= {CPU_PER_USER_TARGET:g}x, "
            + ", ".join(f"{c} <= {t:g}x" for c, t in CPU_PER_USER_TARGETS.items())
            + ")",
            results,
            per_user,
        )
    )


def _per_user_cell(component: str, base: Result, most: Result) -> Callable[[Result], str]:
    """A component's CPU per 1,000 users, and at the most instances its ratio to 1."""

    def cell(r: Result) -> str:
        value, before = _components(r)[component], _components(base)[component]
        if value is None:
            return "(not local)"
        if r is not most or r is base or not before:
            return f"{value:.3f}"
        return f"{value:.3f} ({value / before:.2f}x)"

    return cell


def record_all(results: list[Result], small: Result, cpu_limit: int | None = None) -> None:
    base = next(r for r in results if r.instances == 1)
    limited = f", {cpu_limit}m per process" if cpu_limit else ""
    name = f"identity-fanout: {base.users:,}-user role{limited}, commit -> last event acked"
    targets = _speed_up_targets(cpu_limit)
    for r in results:
        if r.instances == 1:
            continue
        target = targets.get(r.instances)
        record(
            Comparison.duration(
                name,
                Figure(f"{r.instances} instances (worker + relay each)", r.seconds),
                Figure("1 instance", base.seconds),
                # Other counts: shown against "not slower than one", no promise.
                target=1.0 if target is None else round(1 / target, 3),
                note="information only" if target is None else f">= {target:g}x faster",
            )
        )
    most = max(results, key=lambda r: r.instances)
    if cpu_limit and most is not base:
        for component, value in _components(most).items():
            before = _components(base)[component]
            if value is None or not before:
                continue
            target = CPU_PER_USER_TARGETS.get(component, CPU_PER_USER_TARGET)
            record(
                Comparison.duration(
                    f"identity-fanout: {component} CPU per 1,000 users{limited}",
                    Figure(f"{most.instances} instances", value),
                    Figure("1 instance", before),
                    target=target,
                    note=f"<= {target:g}x of 1 instance",
                )
            )
    record(
        Comparison.memory(
            "identity-fanout: worker peak RSS, flat in role size (1 instance)",
            Figure(f"{base.users:,}-user role", max(base.worker_rss_mib)),
            Figure(f"{small.users:,}-user role", max(small.worker_rss_mib)),
            target=RSS_TARGET,
        )
    )


def run(options: Options) -> None:
    admin_dsn, bootstrap = services()
    if 1 not in options.instances:
        raise ValueError("the speed-up is measured against 1 instance: include it")
    with scratch_database(admin_dsn, "pin_bench_scale") as dsn:
        large, small_role = seed(dsn, options.users)
        small_users = max(1, options.users // SMALL_SHARE)
        with console.status(f"1 instance, {small_users:,} users"):
            small = measure(
                dsn,
                bootstrap,
                small_role,
                users=small_users,
                instances=1,
                batch_size=options.batch_size,
                run=0,
                cpu_limit=options.cpu_limit,
            )
        results = []
        for run_no, instances in enumerate(options.instances):
            with console.status(f"{instances} instance(s), {options.users:,} users"):
                result = measure(
                    dsn,
                    bootstrap,
                    large,
                    users=options.users,
                    instances=instances,
                    batch_size=options.batch_size,
                    run=run_no,
                    cpu_limit=options.cpu_limit,
                )
            console.print(f"{instances} instance(s): {result.seconds:.1f} s")
            results.append(result)
    report(results, small, options.cpu_limit)
    record_all(results, small, options.cpu_limit)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--cpu-limit",
        type=int,
        default=None,
        metavar="MILLICORES",
        help="a CPU quota per worker and relay process, as a pod's limit (needs root)",
    )
    args = parser.parse_args()
    run(
        Options(
            users=args.users,
            batch_size=args.batch_size,
            instances=tuple(args.instances),
            cpu_limit=args.cpu_limit,
        )
    )


if __name__ == "__main__":
    main()
