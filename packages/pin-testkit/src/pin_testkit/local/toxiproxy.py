"""Toxiproxy on loopback: network faults between one process and one dependency.

A proxy listens on a port of its own and forwards to an upstream (PostgreSQL, a Kafka
broker); a process pointed at the proxy sees whatever toxics are set on it: latency, a
connection that stops passing data (`timeout`), a reset mid-stream (`reset_peer`), a cut
(the proxy disabled: new connections refused, open ones closed). Faults of one process are
modelled by giving it a proxy of its own.

The server is Toxiproxy 2.5 built from the Go module proxy into the tools cache
(`infra/checks/tools.sh toxiproxy`), driven through its HTTP API.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, Self

from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.tool_process import ToolProcess, ToolServer
from pin_testkit.local.tools import tool_binary
from pin_testkit.ports import free_port

__all__ = ["Proxy", "ToxiproxyServer", "toxiproxy_binary"]

TOXIPROXY_ENV: Final = "PIN_TOXIPROXY"
"""Path of a toxiproxy server binary to use instead of the tools cache's."""
READY_TIMEOUT: Final = 30.0

Stream = Literal["upstream", "downstream"]


def toxiproxy_binary() -> Path:
    return tool_binary("toxiproxy", TOXIPROXY_ENV)


class Proxy:
    """One proxy of a `ToxiproxyServer`: `address` is what the faulty side connects to."""

    def __init__(self, server: ToxiproxyServer, name: str, port: int, upstream: str) -> None:
        self._server = server
        self.name = name
        self.port = port
        self.upstream = upstream
        self._toxics = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add_toxic(
        self,
        kind: str,
        *,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        **attributes: int,
    ) -> str:
        """Add a toxic (`latency`, `timeout`, `reset_peer`, `bandwidth`, `slow_close`,
        `limit_data`, `slicer`) with its attributes; returns its name for `remove_toxic`."""
        self._toxics += 1
        name = f"{kind}-{stream}-{self._toxics}"
        self._server.request(
            "POST",
            f"/proxies/{self.name}/toxics",
            {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            },
        )
        return name

    def remove_toxic(self, name: str) -> None:
        self._server.request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[str]:
        listed: list[dict[str, Any]] = self._server.request("GET", f"/proxies/{self.name}/toxics")
        return [t["name"] for t in listed]

    def disable(self) -> None:
        """Cut: open connections are closed and new ones refused until `enable()`."""
        self._server.request("POST", f"/proxies/{self.name}", {"enabled": False})

    def enable(self) -> None:
        self._server.request("POST", f"/proxies/{self.name}", {"enabled": True})

    def heal(self) -> None:
        """Every toxic removed and the proxy enabled: the path is as if never touched."""
        for name in self.toxics():
            self.remove_toxic(name)
        self.enable()


class ToxiproxyServer(ToolServer):
    """A toxiproxy server of its own (a free port, logs in `workdir`). A context manager."""

    def __init__(self, workdir: Path, *, binary: Path | None = None) -> None:
        self._workdir = workdir
        self._binary = binary
        self._process: ToolProcess | None = None
        self.proxies: dict[str, Proxy] = {}

    def start(self) -> Self:
        self._workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._process = ToolProcess("toxiproxy", self._workdir / "toxiproxy.log", grace=5.0)
        binary = self._binary or toxiproxy_binary()
        self._process.start([str(binary), "-host", "127.0.0.1", "-port", str(self.port)])
        self._process.await_ready(self._ready, timeout=READY_TIMEOUT, interval=0.1)
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.stop()
        self.proxies.clear()

    def proxy(self, name: str, upstream: str, *, port: int | None = None) -> Proxy:
        """A new proxy `name` listening on `port` (a free one by default) -> `upstream`."""
        listen = port or free_port()
        self.request(
            "POST",
            "/proxies",
            {"name": name, "listen": f"127.0.0.1:{listen}", "upstream": upstream, "enabled": True},
        )
        proxy = self.proxies[name] = Proxy(self, name, listen, upstream)
        return proxy

    def heal_all(self) -> None:
        """Every proxy enabled, every toxic removed (Toxiproxy's reset)."""
        self.request("POST", "/reset")

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - loopback, our own server
            f"{self.url}{path}", data=data, method=method
        )
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
                payload = response.read()
                is_json = response.headers.get_content_type() == "application/json"
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise LocalInfraError(f"toxiproxy {method} {path}: {exc.code} {detail}") from exc
        if not is_json:  # /version answers in plain text
            return payload.decode()
        return json.loads(payload) if payload.strip() else None

    def _ready(self) -> bool:
        try:
            self.request("GET", "/version")
        except (urllib.error.URLError, ConnectionError, TimeoutError, LocalInfraError):
            return False
        return True
