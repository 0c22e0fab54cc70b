"""Benchmark comparisons: each benchmark records its figure next to its limit, one table prints all.

A benchmark script measures the subject (the service) and its limit (a plain client, one SQL
statement) in the same run, because on a shared machine only the ratio is stable. It calls
`record` for each comparison; `make bench` points `PIN_BENCH_RESULTS` at one file for every
script and runs `python -m pin_testkit.bench` at the end to print them side by side.

A change is judged against the code it replaces in the same run, too: `checkout_package`
extracts a package as it is at a git revision (`baseline_packages`, several), to put first
on the PYTHONPATH of the processes that run it, beside this checkout's in turn.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, Literal, NamedTuple

import msgspec
from rich.console import Console
from rich.table import Table

from pin_testkit.releases import ROOT

__all__ = [
    "RESULTS_ENV",
    "SERVICE_SOURCE",
    "Comparison",
    "Figure",
    "baseline_packages",
    "busy_share",
    "checkout_package",
    "cpu_seconds",
    "listener_pid",
    "load",
    "machine_jiffies",
    "main",
    "record",
    "summary_table",
]

RESULTS_ENV = "PIN_BENCH_RESULTS"
"""Path of the JSON-lines file the comparisons of one `make bench` run are appended to."""


class Figure(NamedTuple):
    """What was measured (the subject, or the limit it is held against) and its value."""

    label: str
    value: float


class Comparison(msgspec.Struct, frozen=True):
    """One measured figure and its limit, taken in the same run on the same records.

    `better` says which way is good: "higher" for rates (rows/s), "lower" for durations.
    `ratio` is always subject/limit; `target` is the ratio the benchmark promises, in the same
    direction (a rate at least `target` of the limit, a duration at most `target` times it).
    Scripts build one with `rate`, `duration` or `memory`, which set the unit and direction
    that go with the kind of figure. The fields are in the order those constructors fill them
    positionally: a `Figure` unpacks into (label, value), i.e. `subject, subject_value` and
    `limit, limit_value`.
    """

    benchmark: str
    subject: str
    subject_value: float
    limit: str
    limit_value: float
    unit: str
    better: Literal["higher", "lower"]
    target: float
    note: str = ""

    @classmethod
    def rate(
        cls,
        benchmark: str,
        subject: Figure,
        limit: Figure,
        *,
        unit: str,
        target: float,
        note: str = "",
    ) -> Comparison:
        """A throughput in `unit` ("rows/s"): higher is better, `target` is a floor."""
        return cls(benchmark, *subject, *limit, unit, "higher", target, note)

    @classmethod
    def duration(
        cls, benchmark: str, subject: Figure, limit: Figure, *, target: float, note: str = ""
    ) -> Comparison:
        """A time in seconds: lower is better, `target` is a ceiling."""
        return cls(benchmark, *subject, *limit, "s", "lower", target, note)

    @classmethod
    def memory(
        cls, benchmark: str, subject: Figure, limit: Figure, *, target: float, note: str = ""
    ) -> Comparison:
        """A memory footprint in MiB: lower is better, `target` is a ceiling."""
        return cls(benchmark, *subject, *limit, "MiB", "lower", target, note)

    @property
    def ratio(self) -> float:
        return self.subject_value / self.limit_value if self.limit_value else float("inf")

    @property
    def met(self) -> bool:
        return self.ratio >= self.target if self.better == "higher" else self.ratio <= self.target


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far: what a benchmark
    charges to each process it compares (a service, PostgreSQL's backends, the broker)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_LISTEN = "0A"
"""State of a listening socket in /proc/net/tcp."""


def listener_pid(port: int) -> int | None:
    """The local process listening on TCP `port` (the Kafka broker of the bootstrap), if any."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    return int(proc.name)
    return None


def machine_jiffies() -> tuple[int, int]:
    """(all, idle + iowait) CPU time of the whole machine so far, in clock ticks."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of the machine's CPU time busy (anyone's) between two `machine_jiffies()`."""
    total = after[0] - before[0]
    return 1 - (after[1] - before[1]) / total if total else float("nan")


SERVICE_SOURCE: Final = "services/identity-fanout/src"
"""Where the service's package is in the repository: what a baseline replaces."""


def checkout_package(revision: str, into: str, source: str = SERVICE_SOURCE) -> str:
    """The packages under `source` as they are at git `revision`, extracted under `into`;
    the directory to put first on a process's PYTHONPATH (before this checkout's editable
    installs), checked to be where that process imports them from."""
    archive = subprocess.run(  # noqa: S603 - git on this repository, arguments built here
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision, source],  # noqa: S607
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise ValueError(f"no {source} at {revision}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    path = os.path.join(into, source)
    for package in sorted(p.name for p in Path(path).iterdir() if (p / "__init__.py").is_file()):
        found = subprocess.run(  # noqa: S603 - this interpreter, arguments built here
            [
                sys.executable,
                "-c",
                "import sys, importlib.util as u; print(u.find_spec(sys.argv[1]).origin)",
                package,
            ],
            env=os.environ | {"PYTHONPATH": path},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not found.startswith(path + os.sep):
            raise RuntimeError(f"{package} @{revision}: PYTHONPATH={path} imports {found}")
    return path


@contextlib.contextmanager
def baseline_packages(revisions: Sequence[str]) -> Iterator[dict[str, str]]:
    """`checkout_package` of each revision (revision -> its PYTHONPATH directory), in a
    temporary directory removed afterwards; an empty dict for none."""
    with tempfile.TemporaryDirectory(prefix="pin-bench-baseline-") as root:
        yield {
            revision: checkout_package(revision, os.path.join(root, str(n)))
            for n, revision in enumerate(revisions)
        }


def record(comparison: Comparison) -> None:
    """Append the comparison to the run's results file (a no-op when run on its own)."""
    path = os.environ.get(RESULTS_ENV)
    if path:
        with Path(path).open("ab") as out:
            out.write(msgspec.json.encode(comparison) + b"\n")


def load(path: Path) -> list[Comparison]:
    if not path.exists():
        return []
    decoder = msgspec.json.Decoder(Comparison)
    return [decoder.decode(line) for line in path.read_bytes().splitlines() if line.strip()]


_WHOLE = 100.0
"""From here on a figure prints without decimals (rows/s); below it, seconds keep two."""


def _figure(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if value >= _WHOLE else f"{value:,.2f} {unit}"


def summary_table(comparisons: list[Comparison]) -> Table:
    table = Table(title="benchmarks: each figure next to its limit, same run", title_justify="left")
    for column in ("benchmark", "subject", "limit", "ratio", "target", "met"):
        table.add_column(column, overflow="fold")
    for c in comparisons:
        sign = ">=" if c.better == "higher" else "<="
        table.add_row(
            c.benchmark + (f"\n{c.note}" if c.note else ""),
            f"{c.subject}\n{_figure(c.subject_value, c.unit)}",
            f"{c.limit}\n{_figure(c.limit_value, c.unit)}",
            f"{c.ratio:.2f}",
            f"{sign} {c.target:g}",
            "yes" if c.met else "NO",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    """`python -m pin_testkit.bench [FILE]`: print the comparisons of one run as one table."""
    args = sys.argv[1:] if argv is None else argv
    source = args[0] if args else os.environ.get(RESULTS_ENV, "")
    comparisons = load(Path(source)) if source else []
    if not comparisons:
        sys.stderr.write(f"no benchmark results in {source or '$' + RESULTS_ENV}\n")
        return 1
    Console(width=max(100, Console().width)).print(summary_table(comparisons))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
