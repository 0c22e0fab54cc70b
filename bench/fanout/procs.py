"""What every fan-out benchmark needs around the service: a scratch database, the service's
processes as the chart runs them (each as its runtime login, through pin_testkit's
ServiceProcess), and what they count.

One set of helpers for `run.py`, `latency.py`, `scale.py` and `shards.py`: they differ in
what they measure, not in how they start, watch and stop the service.

A baseline (`--baseline REV`) is the same service at a git revision: its `identity_fanout`
package (`pin_testkit.bench.checkout_package`) first on the PYTHONPATH of its processes,
`migrate` included, so it runs on a database its own migrations made; the figures of each
side are taken in turn, round by round (`Side`, `rotated`).
"""

from __future__ import annotations

import contextlib
import statistics
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final, NamedTuple, TypeVar

import psycopg
from rich.console import Console

from identity_fanout.schema import migrate_database
from pin_testkit.bench import cpu_seconds
from pin_testkit.databases import temporary_database
from pin_testkit.discovery import environment_or_local
from pin_testkit.ports import free_port
from pin_testkit.runtime_roles import all_logins, ensure_login, runtime_dsn
from pin_testkit.service import ServiceProcess, run_cli, service_environment

console = Console(width=max(150, Console().width))
"""Wide enough for the tables when the output is a file or a pipe (`make bench | tee`)."""

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
"""The cgroup v1 `cpu` controller: where a pod's `resources.limits.cpu` becomes a CFS quota."""
CFS_PERIOD_US = 100_000

WORKER = ("worker", "--no-relay")
RELAY = ("relay",)
"""The chart's topology: the fan-out and the relay as separate Deployments."""


THIS_CHECKOUT: Final = "this checkout"


class Side(NamedTuple):
    """Whose service a measurement runs: this checkout's (`package` None) or a baseline's,
    the directory of its `identity_fanout` package at a git revision."""

    name: str
    package: str | None = None


def sides(baselines: Mapping[str, str]) -> list[Side]:
    """This checkout, then each baseline (revision -> package directory) as `@<revision>`."""
    return [Side(THIS_CHECKOUT), *(Side(f"@{rev}", package) for rev, package in baselines.items())]


T = TypeVar("T")


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """`items` starting one further each round: none always runs right after the same other
    (whose leftovers, an autovacuum of its deletes, would fall on it)."""
    turn = round_ % len(items)
    return [*items[turn:], *items[:turn]]


def each_round(values: Sequence[float], digits: int = 2) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def spread(values: Sequence[float], digits: int = 2) -> str:
    """min / median / max of the rounds' figures."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:.{digits}f} / {mid:.{digits}f} / {high:.{digits}f}"


def versus(values: Sequence[float], this: Sequence[float]) -> str:
    """The median of `values` over that of `this` (this checkout's), and whether the rounds'
    ranges lie apart (min to max: the difference is beyond the spread)."""
    ratio = statistics.median(values) / statistics.median(this)
    apart = min(values) > max(this) or max(values) < min(this)
    return f"{ratio:.2f}x" + (", ranges apart" if apart else "")


def python_path(package: str | None) -> dict[str, str]:
    """The environment that makes a process import `package` (a baseline's) first."""
    return {} if package is None else {"PYTHONPATH": package}


class Services(NamedTuple):
    admin_dsn: str
    bootstrap: str


def services() -> Services:
    """PostgreSQL and Kafka from the environment (`pin-local env`), else the local ones."""
    found = environment_or_local()
    return Services(found.postgres_dsn, found.kafka_bootstrap)


@contextlib.contextmanager
def scratch_database(admin_dsn: str, prefix: str, package: str | None = None) -> Iterator[str]:
    """A migrated database of its own (runtime logins ensured), dropped again afterwards;
    with `package` (a baseline's), migrated by that package's `identity-fanout migrate`."""
    with temporary_database(admin_dsn, prefix) as dsn:
        if package is None:
            migrate_database(dsn)
        else:
            env = service_environment(
                ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=dsn, **python_path(package)
            )
            run_cli("identity-fanout", ["migrate"], env)
        for _, groups in all_logins():
            ensure_login(admin_dsn, *groups)
        yield dsn


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def database_cpu(dbname: str) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL process working for `dbname` (its backends,
    autovacuum workers), found by their process titles (`postgres: <user> <db> ...`)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if title.startswith("postgres: ") and dbname in title.split():
                found[int(proc.name)] = cpu_seconds(int(proc.name))
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return found


def database_cpu_since(dbname: str, before: dict[int, float]) -> float:
    """CPU seconds the database's processes used since `before` (those still running)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in database_cpu(dbname).items())


def published(processes: Iterable[ServiceProcess]) -> float:
    """`identity_outbox_published_total` summed over `processes` (counted after the DELETE
    of acknowledged rows, so it is what Kafka acknowledged and the outbox let go)."""
    return sum(p.metric("identity_outbox_published_total") for p in processes)


def task_completed(db: psycopg.Connection[tuple[object, ...]], task_id: uuid.UUID) -> bool:
    row = db.execute(
        "SELECT status FROM identity.access_fanout_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    return row is not None and row[0] == "Completed"


def login_of(args: Sequence[str]) -> tuple[str, ...]:
    """The runtime roles a process logs in as (as deployed: docs/design/identity-fanout.md
    "Database roles")."""
    if args[0] == "relay":
        return ("identity_fanout_relay",)
    if "--no-relay" in args:
        return ("identity_fanout_worker",)
    return ("identity_fanout_worker", "identity_fanout_relay")


@contextlib.contextmanager
def launched(
    dsn: str,
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str],
    package: str | None = None,
) -> Iterator[list[ServiceProcess]]:
    """`identity-fanout <command>` processes, each as its runtime login and with a metrics
    port of its own (`package` first on their PYTHONPATH: a baseline's); ready (`/readyz`)
    when this yields, terminated when it ends."""
    base = service_environment(
        ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_LOG_LEVEL="WARNING", **python_path(package)
    )
    with contextlib.ExitStack() as stack:
        processes: list[ServiceProcess] = []
        for args in commands:
            port = free_port()
            process = ServiceProcess(
                name=" ".join(args),
                program="identity-fanout",
                args=tuple(args),
                env=base
                | dict(env)
                | {
                    "IDENTITY_FANOUT_METRICS_PORT": str(port),
                    "IDENTITY_FANOUT_DATABASE_DSN": runtime_dsn(dsn, *login_of(args)),
                },
                metrics_port=port,
            )
            processes.append(stack.enter_context(process.start()))
        for process in processes:  # measured from idle, ready processes
            process.wait_ready(60)
        yield processes


@contextlib.contextmanager
def cpu_limited(pids: Sequence[int], millicores: int) -> Iterator[bool]:
    """Each of ``pids`` in a cgroup of its own with a CFS quota of ``millicores`` (as a
    chart's `resources.limits.cpu: <n>m` gives a pod; every thread of a process moves with
    it; PostgreSQL and Kafka stay unlimited); yields False where the cgroup v1 `cpu`
    controller is not writable. The groups are removed again afterwards."""
    groups: list[Path] = []
    try:
        for pid in pids:
            group = CPU_CGROUP / f"pin-bench-{uuid.uuid4().hex[:8]}"
            group.mkdir()
            groups.append(group)
            (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(CFS_PERIOD_US * millicores // 1000))
            (group / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        console.print(f"[yellow]no CPU limits here ({exc})")
        for group in groups:
            _remove_group(group)
        yield False
        return
    try:
        yield True
    finally:
        for group in groups:
            _remove_group(group)


def _remove_group(group: Path) -> None:
    """Move what is left in the group back to the root group, then remove it."""
    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_CGROUP / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        group.rmdir()
