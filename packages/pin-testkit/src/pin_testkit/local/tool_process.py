"""One server binary of the tools cache run in the background (Prometheus, Toxiproxy).

It owns the process and its log file: start it, wait until the server's own readiness probe
answers (or the process died, or the deadline passed: then it is stopped and the log tail
raised), stop it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.procs import Deadline, tail, terminate

__all__ = ["ToolProcess", "ToolServer"]


class ToolProcess:
    def __init__(self, name: str, log: Path, *, grace: float) -> None:
        self.name = name
        self.log = log
        self._grace = grace
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, argv: Sequence[str]) -> None:
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603 - a binary of the tools cache
                list(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def await_ready(self, ready: Callable[[], bool], *, timeout: float, interval: float) -> None:
        """Poll `ready` (the server's API; it has no readiness notification to wait on)."""
        deadline = Deadline.after(timeout)
        while not deadline.expired() and self.running():
            if ready():
                return
            time.sleep(interval)
        log = tail(self.log)
        self.stop()
        raise LocalInfraError(f"{self.name} did not become ready:\n{log}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            terminate(process.pid, grace=self._grace)
            process.wait(timeout=10)


class ToolServer:
    """A server of the tools cache on a port of its own, used as a context manager."""

    port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError
