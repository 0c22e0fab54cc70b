"""What the demo's parts share: the console and the services' processes (pin_testkit.service)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence

from rich.console import Console

from pin_testkit.ports import free_port
from pin_testkit.service import ServiceProcess, run_cli, script, service_environment

console = Console()

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


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
        self.script = script
        prefix = script.upper().replace("-", "_")
        self.env = service_environment(
            **env,
            **{f"{prefix}_METRICS_PORT": str(self.port), f"{prefix}_LOG_LEVEL": "WARNING"},
        )
        self.process = ServiceProcess(
            name=f"{script} {' '.join(args)}",
            program=script,
            args=tuple(args),
            env=self.env,
            metrics_port=self.port,
        ).start()
        self.process.wait_ready(READY_TIMEOUT)
        console.print(f"started [bold]{self.process.name}[/bold] (metrics on :{self.port})")

    def run(self, *args: str, quiet: bool = False) -> str:
        """Run another command of the same script with the same settings; its stdout.

        Tables are laid out for this terminal, or wide (ids unfolded) when only parsed.
        """
        if not quiet:
            console.print(f"$ {self.script} {' '.join(args)}")
        width = 250 if quiet else console.width
        login = dict(self.tool_env(args)) if self.tool_env is not None else {}
        env = self.env | login | {"COLUMNS": str(width)}
        return run_cli(self.script, args, env).stdout.rstrip()

    def follow(self, *args: str) -> int:
        """Run another command of the same script on this terminal (a watch draws its own
        bars here); its exit code."""
        console.print(f"$ {self.script} {' '.join(args)}")
        login = dict(self.tool_env(args)) if self.tool_env is not None else {}
        return subprocess.run(
            [script(self.script), *args], env=self.env | login, check=False
        ).returncode

    def stop(self) -> int:
        code = self.process.terminate(STOP_TIMEOUT)
        console.print(f"stopped {self.process.name} (SIGTERM, exit code {code})")
        return code
