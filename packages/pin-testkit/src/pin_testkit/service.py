"""A service as an operating-system process: its console script, readiness and metrics.

As an operator runs the services: the installed entry point (``.venv/bin/identity-fanout``,
``.venv/bin/rewards-membership``), configured by environment variables only, watched through
``/readyz`` and ``/metrics`` on its metrics port, stopped with SIGTERM (a graceful stop whose
exit code is checked) or SIGKILL (a crash). The end-to-end suite, the demo, benchmarks and
the services' process tests all start them this way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Final, Self

from prometheus_client.parser import text_string_to_metric_families

from pin_testkit.waiting import wait_until

__all__ = [
    "CommandFailedError",
    "CommandResult",
    "ServiceProcess",
    "run_cli",
    "run_command",
    "sample_key",
    "script",
    "service_environment",
]

READY_TIMEOUT: Final = 120.0
STOP_TIMEOUT: Final = 90.0
KILL_TIMEOUT: Final = 30.0
CLI_TIMEOUT: Final = 120.0
HTTP_TIMEOUT: Final = 5.0


def script(name: str) -> str:
    """The console script ``name`` installed next to this interpreter; a path names one of
    another environment as it is (an earlier release's, ``pin_testkit.releases``)."""
    path = Path(name) if os.sep in name else Path(sys.executable).with_name(name)
    if not path.is_file():
        raise FileNotFoundError(f"console script {path} is missing (uv sync --all-packages)")
    return str(path)


def service_environment(drop_prefixes: Sequence[str] = (), **extra: str) -> dict[str, str]:
    """This process's environment without the variables starting with ``drop_prefixes``
    (settings that would configure a service behind the caller's back), plus ``extra``.

    Output is unbuffered, so a log file shows what a process said up to a crash.
    """
    prefixes = tuple(drop_prefixes)
    env = {k: v for k, v in os.environ.items() if not (prefixes and k.startswith(prefixes))}
    return env | {"PYTHONUNBUFFERED": "1"} | extra


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    """``name{label="value",...}`` with the labels sorted: how :meth:`ServiceProcess.metrics`
    names a sample."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@dataclass
class ServiceProcess:
    """One service process: ``program args`` with the complete environment ``env``.

    Its output goes to ``log_path`` (appended, so restarts keep the earlier runs' lines), or to
    this process's own output when ``log_path`` is None. Every exit code it had is kept in
    ``exit_codes``. Use it as a context manager (or call :meth:`cleanup`) so that it never
    outlives its caller.
    """

    name: str
    program: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    metrics_port: int
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    exit_codes: list[int] = field(default_factory=list)

    def start(self) -> Self:
        """Start it (again, after a stop); returns at once: see :meth:`wait_ready`."""
        if self.running():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        command = [script(self.program), *self.args]  # the project's own console script
        if self.log_path is None:
            self.process = subprocess.Popen(  # noqa: S603
                command, env=dict(self.env), stdin=subprocess.DEVNULL
            )
            return self
        with self.log_path.open("ab") as log:
            log.write(f"=== start {self.program} {' '.join(self.args)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(  # noqa: S603
                command,
                env=dict(self.env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def assert_running(self) -> None:
        """Fail (with its log tail) if it was started and has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode}: {self.log_tail()}"
            )

    # -- its HTTP endpoints -------------------------------------------------------------------

    def get(self, path: str) -> tuple[int, str]:
        """``GET http://127.0.0.1:PORT{path}``: status and body (an error status too)."""
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (False while nothing listens yet)."""
        try:
            status, _ = self.get("/readyz")
        except OSError:
            return False
        return status == HTTPStatus.OK

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> float:
        """Until ``/readyz`` answers 200; the seconds it took. Fails at once if it exits."""
        return wait_until(
            self.ready, timeout=timeout, what=f"{self.name} /readyz 200", alive=[self]
        )

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics`` by :func:`sample_key` (``name{label="value",...}``)."""
        status, text = self.get("/metrics")
        if status != HTTPStatus.OK:
            raise AssertionError(f"{self.name} /metrics answered {status}: {text}")
        return {
            sample_key(sample.name, sample.labels): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics``; 0.0 while it has not been exported yet."""
        return self.metrics().get(sample_key(name, labels), 0.0)

    # -- stopping -----------------------------------------------------------------------------

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait: the graceful stop an orchestrator asks for. The exit code."""
        process = self._started()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout)
        self.exit_codes.append(code)
        return code

    def kill(self) -> int:
        """SIGKILL: a crash, nothing flushed, nothing handed back. The exit code (-9)."""
        process = self._started()
        process.kill()
        code = process.wait(KILL_TIMEOUT)
        self.exit_codes.append(code)
        return code

    def cleanup(self) -> None:
        """Whatever state it was left in: gone afterwards (SIGTERM, then SIGKILL)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(KILL_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(KILL_TIMEOUT)

    def log_text(self) -> str:
        """Everything it logged so far, every run ('' without a log file)."""
        if self.log_path is None:
            return ""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def log_tail(self, lines: int = 25) -> str:
        """The last ``lines`` of its log file ('' without one)."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cleanup()

    def _started(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process


@dataclass(frozen=True)
class CommandResult:
    """What one CLI command did: its arguments, exit code and output."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandFailedError(AssertionError):
    """A CLI command expected to succeed exited non-zero; the message holds its stderr."""


def run_cli(
    program: str,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float = CLI_TIMEOUT,
    check: bool = True,
) -> CommandResult:
    """One command of a service's CLI as an operator types it, with the complete ``env``.

    With ``check`` (the default) a non-zero exit raises :class:`CommandFailedError`.
    """
    return run_command(
        program, [script(program)], args, env=dict(env), timeout=timeout, check=check
    )


def run_command(
    name: str,
    launcher: Sequence[str],
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    check: bool,
) -> CommandResult:
    """``launcher + args`` (a console script, or ``docker run ... image``) as ``run_cli``
    runs a command: output captured, no standard input, the exit code checked when asked
    (the failure named by ``name`` and ``args``)."""
    done = subprocess.run(  # noqa: S603 - the project's own command, arguments built here
        [*launcher, *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    result = CommandResult(tuple(args), done.returncode, done.stdout, done.stderr)
    if check and done.returncode != 0:
        raise CommandFailedError(f"{name} {' '.join(args)} -> {done.returncode}: {done.stderr}")
    return result
