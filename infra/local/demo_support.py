"""What the demo's parts share: console, processes of the services, waiting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from pathlib import Path

from rich.console import Console

console = Console()


def bin_path(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == HTTPStatus.OK)
    except OSError:
        return False


def await_(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.1)


class Service:
    """A service started through its console script, as an operator would, until stopped."""

    def __init__(
        self,
        script: str,
        args: list[str],
        env: Mapping[str, str],
        *,
        tool_env: Callable[[Sequence[str]], Mapping[str, str]] | None = None,
    ) -> None:
        """`env` is the service's; `tool_env(args)` what `run(*args)` changes in it (the
        login of the command's runtime role: an operator's command is not the worker's)."""
        self.tool_env = tool_env
        self.port = free_port()
        self.name = f"{script} {' '.join(args)}"
        prefix = script.upper().replace("-", "_")
        self.env = (
            dict(os.environ)
            | dict(env)
            | {
                f"{prefix}_METRICS_PORT": str(self.port),
                f"{prefix}_LOG_LEVEL": "WARNING",
            }
        )
        self.script = script
        self.process = subprocess.Popen([bin_path(script), *args], env=self.env)
        await_(lambda: ready(self.port), 60, f"{self.name} ready")
        console.print(f"started [bold]{self.name}[/bold] (metrics on :{self.port})")

    def run(self, *args: str, quiet: bool = False) -> str:
        """Run another command of the same script with the same settings; its stdout.

        Tables are laid out for this terminal, or wide (ids unfolded) when only parsed.
        """
        if not quiet:
            console.print(f"$ {self.script} {' '.join(args)}")
        width = 250 if quiet else console.width
        login = dict(self.tool_env(args)) if self.tool_env is not None else {}
        result = subprocess.run(
            [bin_path(self.script), *args],
            env=self.env | login | {"COLUMNS": str(width)},
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.rstrip()

    def stop(self) -> int:
        self.process.terminate()
        code = self.process.wait(60)
        console.print(f"stopped {self.name} (SIGTERM, exit code {code})")
        return code
