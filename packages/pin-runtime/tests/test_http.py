from __future__ import annotations

import datetime
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry, Counter

from pin_runtime.http import (
    CheckResult,
    ComponentState,
    Heartbeat,
    OpsServer,
    degraded,
    ok,
)
from pin_runtime.logging import FIELDS_ATTRIBUTE


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("access_fanout_events_emitted", "Events written to the outbox", registry=registry).inc(
        3
    )
    return registry


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(registry: CollectorRegistry, clock: FakeClock) -> Iterator[OpsServer]:
    ops = OpsServer(registry=registry, heartbeat=Heartbeat(stale_after=30, clock=clock))
    ops.start("127.0.0.1", 0)
    yield ops
    ops.stop()


def get(ops: OpsServer, path: str, accept: str = "") -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{ops.port}{path}")
    if accept:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def body(raw: bytes) -> Any:
    return msgspec.json.decode(raw)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    value: dict[str, Any] = getattr(record, FIELDS_ATTRIBUTE)
    return value


def test_metrics_exposition(server: OpsServer) -> None:
    status, content_type, raw = get(server, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert b"access_fanout_events_emitted_total 3.0" in raw


def test_metrics_openmetrics_negotiated(server: OpsServer) -> None:
    status, content_type, raw = get(server, "/metrics", accept="application/openmetrics-text")
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert raw.endswith(b"# EOF\n")


def test_healthz_follows_heartbeat(server: OpsServer, clock: FakeClock) -> None:
    status, content_type, raw = get(server, "/healthz")
    assert (status, content_type) == (200, "application/json")
    assert body(raw)["status"] == "ok"

    clock.now += 31
    status, _, raw = get(server, "/healthz")
    assert status == 503
    assert body(raw)["status"] == "stale"
    assert "31.0s old" in body(raw)["reason"]

    assert server.heartbeat is not None
    server.heartbeat.beat()
    assert get(server, "/healthz")[0] == 200


def test_readyz_runs_checks(server: OpsServer) -> None:
    assert get(server, "/readyz")[0] == 200  # no checks: ready
    postgres = ComponentState(initial=None)
    server.add_check("postgres", postgres)
    server.add_check("kafka", lambda: ok("assigned 3 partitions"))

    status, _, raw = get(server, "/readyz")
    assert status == 200
    checks = body(raw)["checks"]
    assert body(raw)["status"] == "ok"
    assert checks["kafka"] == {"status": "ok"}  # a check's free text is never served
    assert checks["postgres"]["status"] == "ok"
    assert datetime.datetime.fromisoformat(checks["postgres"]["since"]).tzinfo is not None

    postgres.degraded("connection to 10.1.2.3 refused for user app_owner, retrying")
    status, _, raw = get(server, "/readyz")
    assert status == 503
    assert body(raw)["status"] == "degraded"
    assert set(body(raw)["checks"]["postgres"]) == {"status", "since", "category"}
    assert body(raw)["checks"]["postgres"]["category"] == "unavailable"
    assert b"10.1.2.3" not in raw
    assert b"app_owner" not in raw
    assert b"refused" not in raw


def test_readyz_serves_a_checks_public_facts_beside_its_status(server: OpsServer) -> None:
    paused = [{"partition": 0, "reason": "lock_timeout", "since": "2026-01-01T00:00:00+00:00"}]
    server.add_check(
        "partitions",
        lambda: CheckResult("ok", "row (1,2) locked by pid 4242", public={"paused": paused}),
    )
    server.add_check("worst", lambda: CheckResult("ok", public={"status": "degraded", "extra": 1}))
    status, _, raw = get(server, "/readyz")
    assert status == 200  # facts do not change readiness
    checks = body(raw)["checks"]
    assert checks["partitions"] == {"status": "ok", "paused": paused}
    assert checks["worst"] == {"status": "ok", "extra": 1}  # never replaces the status
    assert b"4242" not in raw  # the detail stays in the process


def test_readyz_never_serves_exception_text_and_logs_it_once_per_change(
    server: OpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "password=hunter2"
    kafka = ComponentState()
    server.add_check("kafka", kafka)
    assert kafka.name == "kafka"  # named after its check
    starting = body(get(server, "/readyz")[2])["checks"]["kafka"]
    assert starting["category"] == "starting"

    caplog.set_level(logging.INFO, logger="pin_runtime.http")
    kafka.ok()
    assert not [r for r in caplog.records if r.getMessage() == "component recovered"]
    kafka.degraded(f"SASL authentication error ({secret})", category="auth")
    for _ in range(3):  # probes do not log
        status, _, raw = get(server, "/readyz")
        assert status == 503
        assert secret.encode() not in raw
    kafka.degraded(f"SASL authentication error again ({secret})", category="auth")  # same
    kafka.degraded("all brokers down")  # the category changes: logged
    kafka.ok()
    events = [(r.getMessage(), fields(r)) for r in caplog.records if r.name == "pin_runtime.http"]
    assert [(event, f["category"]) for event, f in events] == [
        ("component degraded", "auth"),
        ("component degraded", "unavailable"),
        ("component recovered", "unavailable"),
    ]
    assert events[0][1] == {
        "component": "kafka",
        "category": "auth",
        "reason": f"SASL authentication error ({secret})",
    }
    assert events[2][1]["degradedSeconds"] >= 0
    assert body(get(server, "/readyz")[2])["checks"]["kafka"]["status"] == "ok"


def test_raising_check_is_degraded_not_500_and_logged_once(
    server: OpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    failing = True

    def flaky() -> CheckResult:
        if failing:
            raise RuntimeError("oops at db.internal:5432")
        return ok()

    server.add_check("broken", flaky)
    caplog.set_level(logging.INFO, logger="pin_runtime.http")
    for _ in range(3):
        status, _, raw = get(server, "/readyz")
        assert status == 503
        assert body(raw)["checks"]["broken"] == {"status": "degraded", "category": "check-failed"}
    failing = False
    assert get(server, "/readyz")[0] == 200
    assert get(server, "/readyz")[0] == 200
    logged = [r.getMessage() for r in caplog.records if r.name == "pin_runtime.http"]
    assert logged == ["readiness check failed", "readiness check answers again"]


def test_duplicate_check_name_rejected(server: OpsServer) -> None:
    server.add_check("x", ok)
    with pytest.raises(ValueError, match="already registered"):
        server.add_check("x", ok)


def test_unknown_path_is_404(server: OpsServer) -> None:
    assert get(server, "/")[0] == 404
    assert get(server, "/metricsx")[0] == 404


def test_query_string_ignored(server: OpsServer) -> None:
    assert get(server, "/healthz?verbose=1")[0] == 200


def test_no_heartbeat_means_alive(registry: CollectorRegistry) -> None:
    ops = OpsServer(registry=registry).start("127.0.0.1", 0)
    try:
        assert get(ops, "/healthz")[0] == 200
    finally:
        ops.stop()


def test_stop_releases_port_and_is_idempotent(registry: CollectorRegistry) -> None:
    ops = OpsServer(registry=registry).start("127.0.0.1", 0)
    port = ops.port
    ops.stop()
    ops.stop()
    with pytest.raises(RuntimeError, match="not started"):
        _ = ops.port
    again = OpsServer(registry=registry).start("127.0.0.1", port)
    again.stop()


def test_start_twice_rejected(server: OpsServer) -> None:
    with pytest.raises(RuntimeError, match="already started"):
        server.start("127.0.0.1", 0)


def test_component_state_keeps_first_since() -> None:
    state = ComponentState()
    first = state()
    assert first.status == "degraded"
    assert first.category == "starting"
    assert first.detail.endswith(": starting")
    state.degraded("a")
    since = state().since
    state.degraded("b")
    assert state().detail.endswith(": b")  # in process, the latest reason
    assert state().since == since
    assert since is not None
    assert since.tzinfo is not None
    state.ok()
    assert state().status == "ok"
    assert state().detail == ""
    assert degraded("x") == CheckResult("degraded", "x", category="unavailable")
    with pytest.raises(ValueError, match="category"):
        state.degraded("c", category="Connection refused by 10.0.0.1")


def test_heartbeat_validation(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="stale_after"):
        Heartbeat(stale_after=0)
    beat = Heartbeat(stale_after=1, clock=clock)
    assert not beat.stale()
    clock.now += 2
    assert beat.stale()
    assert beat.age() == 2
