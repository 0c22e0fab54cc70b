"""A service as a container of its image: what ``ServiceProcess`` is for a host process.

The same interface (start, readiness and metrics on its loopback metrics port, SIGTERM
through ``docker stop``, SIGKILL through ``docker kill``, a restart with ``docker start`` of
the same container, so its log keeps every run), run as the charts run the image: host
networking, a read-only root filesystem with only /tmp writable, the numeric non-root user,
no capabilities. Only the service's own variables are passed (the host's PATH and the like
would break the image's); their values reach ``docker`` through its environment, never its
command line. Each container carries the label ``pin-platform=e2e`` so
``infra/docker/engine.sh down`` removes what a killed run left behind.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Self

from pin_testkit.service import (
    CLI_TIMEOUT,
    KILL_TIMEOUT,
    STOP_TIMEOUT,
    CommandResult,
    ServiceProcess,
    run_command,
)

__all__ = ["HARDENED", "ServiceContainer", "container_environment", "run_cli_container"]

DOCKER: Final = "docker"
HARDENED: Final = (
    "--network=host",
    "--read-only",
    "--tmpfs=/tmp",
    "--user=10001:10001",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--label=pin-platform=e2e",
)
PASSED_PREFIXES: Final = ("IDENTITY_FANOUT_", "REWARDS_MEMBERSHIP_", "OTEL_", "PIN_")
PASSED_NAMES: Final = frozenset({"COLUMNS", "LANG", "TZ"})
INSPECT_EVERY: Final = 0.5  # without a host pid: ask docker at most this often


def container_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` a service reads, without the host's own."""
    return {k: v for k, v in env.items() if k.startswith(PASSED_PREFIXES) or k in PASSED_NAMES}


def _docker(*args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0) -> str:
    done = subprocess.run(  # noqa: S603 - the docker client, arguments built here
        [DOCKER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])} -> {done.returncode}: {done.stderr}")
    return done.stdout


def _client_env(env: Mapping[str, str]) -> dict[str, str]:
    """The docker client's environment: the host's (PATH, DOCKER_HOST) and the values that
    `-e NAME` passes on."""
    return {**os.environ, **env}


@dataclass
class ServiceContainer(ServiceProcess):
    """``program args`` in a container of ``image``; see the module's description."""

    image: str = ""
    container: str = ""
    _inspected_at: float = field(default=0.0, repr=False)
    _running: bool = field(default=False, repr=False)
    _host_pid: int = field(default=0, repr=False)

    def start(self) -> Self:
        if self.container:
            _docker("start", self.container)
        else:
            self.container = f"pin-{self.name}-{uuid.uuid4().hex[:8]}"
            passed = container_environment(self.env)
            names = [arg for name in sorted(passed) for arg in ("-e", name)]
            _docker(
                "run", "--detach", "--name", self.container, *HARDENED, *names,
                self.image, *self.args,
                env=_client_env(passed),
            )  # fmt: skip
        self._inspected_at = 0.0
        # wait_until asks assert_running at every poll (every 20 ms where a scenario strikes
        # at a count): the container's process in this host's /proc answers at once, where a
        # `docker inspect` takes a round trip. Under a VM's engine there is none: inspect.
        pid = int(self._state("{{.State.Pid}}") or 0)
        self._host_pid = pid if pid > 0 and Path(f"/proc/{pid}").exists() else 0
        return self

    @property
    def pid(self) -> int:
        return int(self._state("{{.State.Pid}}"))

    def running(self) -> bool:
        if not self.container:
            return False
        if self._host_pid:
            return Path(f"/proc/{self._host_pid}").exists()
        now = time.monotonic()
        if now - self._inspected_at >= INSPECT_EVERY:
            self._running = self._state("{{.State.Running}}") == "true"
            self._inspected_at = now
        return self._running

    def assert_running(self) -> None:
        if self.container and not self.running():
            code = self._state("{{.State.ExitCode}}")
            raise AssertionError(f"{self.name} exited with {code}: {self.log_tail()}")

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """``docker stop``: SIGTERM, SIGKILL after ``timeout``; the container's exit code."""
        self._require()
        _docker("stop", "--time", str(int(timeout)), self.container, timeout=timeout + 30)
        return self._exited()

    def kill(self) -> int:
        """``docker kill``: SIGKILL, a crash; the exit code (137)."""
        self._require()
        _docker("kill", self.container)
        return self._exited()

    def cleanup(self) -> None:
        """Stopped (SIGTERM first) and removed, its log kept in ``log_path``."""
        if not self.container:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            _docker("stop", "--time", str(int(KILL_TIMEOUT)), self.container)
        if self.log_path is not None:
            self.log_path.write_text(self.log_text())
        with contextlib.suppress(RuntimeError):
            _docker("rm", "--force", "--volumes", self.container)
        self.container = ""

    def log_text(self) -> str:
        if not self.container:
            return super().log_text()
        done = subprocess.run(  # noqa: S603
            [DOCKER, "logs", self.container],
            capture_output=True,
            text=True,
            check=False,
            errors="replace",
            stdin=subprocess.DEVNULL,
        )
        return done.stdout + done.stderr

    def _exited(self) -> int:
        deadline = time.monotonic() + KILL_TIMEOUT
        while self._state("{{.State.Running}}") == "true":
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.name} still runs {KILL_TIMEOUT:g}s after its stop")
            time.sleep(0.1)
        self._inspected_at = 0.0
        self._host_pid = 0
        code = int(self._state("{{.State.ExitCode}}"))
        self.exit_codes.append(code)
        return code

    def _state(self, template: str) -> str:
        return _docker("inspect", "--format", template, self.container).strip()

    def _require(self) -> None:
        if not self.container:
            raise RuntimeError(f"{self.name} was never started")


def run_cli_container(
    image: str,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float = CLI_TIMEOUT,
    check: bool = True,
) -> CommandResult:
    """``run_cli`` in a throwaway container of ``image`` (its entry point is the CLI)."""
    passed = container_environment(env)
    names = [arg for name in sorted(passed) for arg in ("-e", name)]
    launcher = [DOCKER, "run", "--rm", *HARDENED, *names, image]
    return run_command(image, launcher, args, env=_client_env(passed), timeout=timeout, check=check)
