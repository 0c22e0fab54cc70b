"""The one operations HTTP server of a worker: `/metrics`, `/healthz`, `/readyz`.

Liveness answers "is the main loop still turning" (a heartbeat the loop ticks), readiness
answers "can this process do its job now" from state the service already knows. Both must
stay cheap: an orchestrator calls them every few seconds and a slow probe restarts pods.
`/readyz` is unauthenticated, so it shows states, times and categories, never error text.
"""

from __future__ import annotations

import datetime
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Literal

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from pin_runtime.logging import FIELDS_ATTRIBUTE, log_event

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


_CATEGORY = re.compile(r"[a-z][a-z0-9_-]{0,31}")


class CheckResult(msgspec.Struct, frozen=True):
    """Outcome of one readiness check.

    `/readyz` serves `status`, `since`, `category` and `public` only. `detail` (an
    exception's text, say) stays in the process: it may hold host names, user names or
    worse, and it changes with every error, so it goes to the log once per change of state
    instead.
    """

    status: Literal["ok", "degraded"]
    detail: str = ""
    since: datetime.datetime | None = None
    category: str = ""
    """A short stable word (`starting`, `unavailable`, ...): safe to serve and to alert on."""
    public: Mapping[str, Any] | None = None
    """Facts the check built to be served beside its status (numbers, short words, times;
    never an exception's text): what is partly wrong in a process that is still ready, say.
    Their keys never replace `status`, `since` or `category`."""


def ok(detail: str = "") -> CheckResult:
    return CheckResult("ok", detail)


def degraded(detail: str, *, category: str = "unavailable") -> CheckResult:
    return CheckResult("degraded", detail, category=_checked(category))


def _checked(category: str) -> str:
    if not _CATEGORY.fullmatch(category):
        raise ValueError(f"a readiness category is a short lower-case word, got {category!r}")
    return category


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
    check reports the state, since when and a category without touching the dependency.
    The reason is logged (`component degraded`, WARNING) when the state or its category
    changes, and the recovery too (`component recovered`, INFO): once per change, never per
    probe. `OpsServer.add_check` names an unnamed state after its check.
    """

    def __init__(self, *, initial: str | None = "starting", name: str = "") -> None:
        self._lock = threading.Lock()
        self.name = name
        self._reason: str | None = initial
        self._category = "starting"
        self._since = datetime.datetime.now(datetime.UTC)

    def ok(self) -> None:
        with self._lock:
            if self._reason is None:
                return
            now = datetime.datetime.now(datetime.UTC)
            was, since = self._category, self._since
            self._reason, self._since = None, now
        if was != "starting":
            log_event(
                _log,
                "component recovered",
                component=self.name,
                category=was,
                degradedSeconds=round((now - since).total_seconds(), 3),
            )

    def degraded(self, reason: str, *, category: str = "unavailable") -> None:
        _checked(category)
        with self._lock:
            changed = self._reason is None or self._category != category
            if self._reason is None:
                self._since = datetime.datetime.now(datetime.UTC)
            self._reason, self._category = reason, category  # keep the first `since`
        if changed:
            log_event(
                _log,
                "component degraded",
                logging.WARNING,
                component=self.name,
                category=category,
                reason=reason,
            )

    def __call__(self) -> CheckResult:
        with self._lock:
            reason, since, category = self._reason, self._since, self._category
        if reason is None:
            return CheckResult("ok", since=since)
        return CheckResult(
            "degraded",
            f"degraded since {since.isoformat(timespec='seconds')}: {reason}",
            since=since,
            category=category,
        )


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
        self._checks: dict[str, Check] = {}
        self._failing: dict[str, str] = {}  # check name -> exception type, while it raises
        self._failing_lock = threading.Lock()
        for name, check in (checks or {}).items():
            self.add_check(name, check)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def add_check(self, name: str, check: Check) -> None:
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is already registered")
        if isinstance(check, ComponentState) and not check.name:
            check.name = name  # its log lines name the component as /readyz does
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
        """Each check's status, since when and category; never a check's `detail`."""
        results = {name: self._run(name, check) for name, check in list(self._checks.items())}
        ready = all(r.status == "ok" for r in results.values())
        body = {
            "status": "ok" if ready else "degraded",
            "checks": {name: _public(r) for name, r in results.items()},
        }
        return (HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE), body

    def _run(self, name: str, check: Check) -> CheckResult:
        """Run `check`; one that raises reports itself degraded (logged once until it stops)."""
        try:
            result = check()
        except Exception as exc:
            kind = type(exc).__name__
            with self._failing_lock:
                first = self._failing.get(name) != kind
                self._failing[name] = kind
            if first:
                _log.exception("readiness check failed", extra={FIELDS_ATTRIBUTE: {"check": name}})
            return CheckResult("degraded", f"check raised {kind}: {exc}", category="check-failed")
        with self._failing_lock:
            recovered = self._failing.pop(name, None) is not None
        if recovered:
            log_event(_log, "readiness check answers again", check=name)
        return result

    def bind(self, host: str = "0.0.0.0", port: int = 9090) -> OpsServer:  # noqa: S104
        """Listen (port 0 picks a free one, see `port`) without answering yet: a request
        waits in the socket's backlog until `start`."""
        if self._server is not None:
            raise RuntimeError("ops server already bound")
        server = _Server((host, port), _Handler)
        server.ops = self
        self._server = server
        return self

    def start(self, host: str = "0.0.0.0", port: int = 9090) -> OpsServer:  # noqa: S104
        """Serve from a daemon thread, on the address `bind` took, else on this one."""
        if self._thread is not None:
            raise RuntimeError("ops server already started")
        server = self._server or self.bind(host, port)._server
        if server is None:  # bind() sets it or raises
            raise RuntimeError("ops server not bound")
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
        if thread is not None:  # shutdown() waits for a serve_forever loop: one must run
            server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout)


def _public(result: CheckResult) -> dict[str, Any]:
    """What `/readyz` shows of a check: nothing a check's free text could leak."""
    body: dict[str, Any] = {"status": result.status}
    if result.since is not None:
        body["since"] = result.since.isoformat(timespec="seconds")
    if result.category:
        body["category"] = result.category
    for key, value in (result.public or {}).items():
        body.setdefault(key, value)
    return body
