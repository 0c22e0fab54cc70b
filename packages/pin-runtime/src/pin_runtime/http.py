"""The one operations HTTP server of a worker: `/metrics`, `/healthz`, `/readyz`.

Liveness answers "is the main loop still turning" (a heartbeat the loop ticks), readiness
answers "can this process do its job now" from state the service already knows. Both must
stay cheap: an orchestrator calls them every few seconds and a slow probe restarts pods.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Literal

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = [
    "Check",
    "CheckResult",
    "ComponentState",
    "Heartbeat",
    "OpsServer",
    "degraded",
    "ok",
]

_log = logging.getLogger(__name__)
_JSON: Final = "application/json"


class CheckResult(msgspec.Struct, frozen=True):
    """Outcome of one readiness check; `detail` says why when degraded."""

    status: Literal["ok", "degraded"]
    detail: str = ""


def ok(detail: str = "") -> CheckResult:
    return CheckResult("ok", detail)


def degraded(detail: str) -> CheckResult:
    return CheckResult("degraded", detail)


Check = Callable[[], CheckResult]


class Heartbeat:
    """Ticked by the main loop; stale when the last tick is older than `stale_after` seconds."""

    def __init__(self, *, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        if stale_after <= 0:
            raise ValueError(f"stale_after must be > 0, got {stale_after}")
        self.stale_after = stale_after
        self._clock = clock
        # Born fresh: the loop gets a full `stale_after` to make its first tick.
        self._last = clock()

    def beat(self) -> None:
        self._last = self._clock()  # one float store: atomic under the GIL, no lock needed

    def age(self) -> float:
        return max(0.0, self._clock() - self._last)

    def stale(self) -> bool:
        return self.age() > self.stale_after


class ComponentState:
    """What a service knows about one dependency, as a readiness check.

    The service calls `ok()` / `degraded(reason)` where it already handles outcomes; the
    check reports "degraded since <time>: <reason>" without touching the dependency.
    """

    def __init__(self, *, initial: str | None = "starting") -> None:
        self._lock = threading.Lock()
        self._reason: str | None = initial
        self._since = datetime.datetime.now(datetime.UTC)

    def ok(self) -> None:
        with self._lock:
            if self._reason is not None:
                self._reason = None
                self._since = datetime.datetime.now(datetime.UTC)

    def degraded(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._since = datetime.datetime.now(datetime.UTC)
            self._reason = reason  # keep the first `since`, show the latest reason

    def __call__(self) -> CheckResult:
        with self._lock:
            reason, since = self._reason, self._since
        if reason is None:
            return ok()
        return degraded(f"degraded since {since.isoformat(timespec='seconds')}: {reason}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck scrape must not keep the process alive
    ops: OpsServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        ops = self.server.ops
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(HTTPStatus.OK, content_type, encoder(ops.registry))
        elif path == "/healthz":
            self._send_json(*ops.liveness())
        elif path == "/readyz":
            self._send_json(*ops.readiness())
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n")

    def _send_json(self, status: HTTPStatus, body: Mapping[str, Any]) -> None:
        self._send(status, _JSON, msgspec.json.encode(body) + b"\n")

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # The default writes to stderr, bypassing the JSON logs; probes are noise at INFO.
        _log.debug(format, *args)


class OpsServer:
    """`/metrics` from `registry`, `/healthz` from `heartbeat`, `/readyz` from named checks."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        heartbeat: Heartbeat | None = None,
        checks: Mapping[str, Check] | None = None,
    ) -> None:
        self.registry = registry
        self.heartbeat = heartbeat
        self._checks: dict[str, Check] = dict(checks or {})
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def add_check(self, name: str, check: Check) -> None:
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is already registered")
        self._checks[name] = check

    def liveness(self) -> tuple[HTTPStatus, dict[str, Any]]:
        if self.heartbeat is None:
            return HTTPStatus.OK, {"status": "ok"}
        age = round(self.heartbeat.age(), 3)
        if age > self.heartbeat.stale_after:
            reason = f"main loop heartbeat is {age:.1f}s old (limit {self.heartbeat.stale_after}s)"
            return HTTPStatus.SERVICE_UNAVAILABLE, {"status": "stale", "reason": reason}
        return HTTPStatus.OK, {"status": "ok", "heartbeat_age_seconds": age}

    def readiness(self) -> tuple[HTTPStatus, dict[str, Any]]:
        results = {name: _run(check) for name, check in list(self._checks.items())}
        ready = all(r.status == "ok" for r in results.values())
        body = {
            "status": "ok" if ready else "degraded",
            "checks": {name: msgspec.structs.asdict(r) for name, r in results.items()},
        }
        return (HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE), body

    def start(self, host: str = "0.0.0.0", port: int = 9090) -> OpsServer:  # noqa: S104
        """Bind (port 0 picks a free one, see `port`) and serve from a daemon thread."""
        if self._server is not None:
            raise RuntimeError("ops server already started")
        server = _Server((host, port), _Handler)
        server.ops = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            # shutdown() waits for the loop to look at its flag: 0.1 s bounds a stop's latency.
            kwargs={"poll_interval": 0.1},
            name="pin-ops-http",
            daemon=True,
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("ops server not started")
        return int(self._server.server_address[1])

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and release the socket; safe to call twice."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout)


def _run(check: Check) -> CheckResult:
    try:
        return check()
    except Exception as exc:  # a broken check reports itself instead of failing the probe
        _log.exception("readiness check failed")
        return degraded(f"check raised {type(exc).__name__}: {exc}")
