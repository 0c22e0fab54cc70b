"""The two services as operating-system processes, started through their console scripts.

As an operator runs them: the installed entry points (``.venv/bin/identity-fanout``,
``.venv/bin/rewards-membership``), configured by environment variables only, watched through
``/readyz`` and ``/metrics``, stopped with SIGTERM (a clean exit 0) or SIGKILL (a crash).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "IDENTITY_FANOUT",
    "REWARDS_MEMBERSHIP",
    "CommandResult",
    "ServiceProcess",
    "free_port",
    "run_cli",
    "script",
    "wait_until",
]

IDENTITY_FANOUT: Final = "identity-fanout"
REWARDS_MEMBERSHIP: Final = "rewards-membership"
READY_TIMEOUT: Final = 120.0
STOP_TIMEOUT: Final = 90.0
CLI_TIMEOUT: Final = 120.0
POLL: Final = 0.05


def script(name: str) -> str:
    """The console script installed next to this interpreter."""
    path = Path(sys.executable).with_name(name)
    assert path.is_file(), f"console script {path} is missing (uv sync --all-packages)"
    return str(path)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = POLL,
    alive: Sequence[ServiceProcess] = (),
) -> float:
    """Poll ``condition`` until it holds; the seconds it took. Fails on timeout or a crash."""
    started = time.monotonic()
    while not condition():
        for process in alive:
            process.assert_running()
        if time.monotonic() - started > timeout:
            details = "".join(f"\n{p.name}: {p.log_tail()}" for p in alive)
            raise AssertionError(f"not within {timeout:.0f}s: {what}{details}")
        time.sleep(interval)
    return time.monotonic() - started


def _base_env() -> dict[str, str]:
    # The test session's environment minus anything that would configure the services behind
    # the scenario's back (another suite's DSNs, tracing exporters).
    prefixes = ("IDENTITY_FANOUT_", "REWARDS_MEMBERSHIP_", "OTEL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "240"  # rich tables of the CLIs unfolded, for the assertions
    return env


@dataclass
class ServiceProcess:
    """One running service process: its console script, arguments, settings and log file."""

    name: str
    program: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    metrics_port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    exit_codes: list[int] = field(default_factory=list)

    def start(self) -> ServiceProcess:
        assert self.process is None or self.process.poll() is not None
        with self.log_path.open("ab") as log:
            log.write(f"=== start {self.program} {' '.join(self.args)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [script(self.program), *self.args],
                env={**_base_env(), **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def assert_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode}: {self.log_tail()}"
            )

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def ready(self) -> bool:
        try:
            status, _ = self.get("/readyz")
        except OSError:
            return False
        return status == HTTPStatus.OK

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> float:
        return wait_until(
            self.ready, timeout=timeout, what=f"{self.name} /readyz 200", alive=[self]
        )

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics`` by ``name{label="value",...}`` (labels sorted)."""
        status, text = self.get("/metrics")
        assert status == HTTPStatus.OK, text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return samples

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait: the graceful stop an orchestrator asks for. The exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        self.exit_codes.append(code)
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed, nothing handed back."""
        assert self.process is not None
        self.process.kill()
        code = self.process.wait(30)
        self.exit_codes.append(code)

    def cleanup(self) -> None:
        """Whatever state the test left it in: gone afterwards."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)

    def log_tail(self, lines: int = 25) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""


@dataclass(frozen=True)
class CommandResult:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run_cli(program: str, args: Sequence[str], env: Mapping[str, str]) -> CommandResult:
    """One CLI command as an operator types it; fails the test on a non-zero exit."""
    done = subprocess.run(
        [script(program), *args],
        env={**_base_env(), **env},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    result = CommandResult(tuple(args), done.returncode, done.stdout, done.stderr)
    assert done.returncode == 0, f"{program} {' '.join(args)} -> {done.returncode}: {done.stderr}"
    return result
