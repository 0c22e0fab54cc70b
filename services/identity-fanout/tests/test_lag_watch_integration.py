"""`identity-fanout lag-watch` as the chart runs it: its own settings (no database DSN), the
consumer groups of the topic found by discovery, a bad setting refused with exit 2."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pin_testkit.ports import free_port
from pin_testkit.records import commit_group_offsets, produce
from pin_testkit.service import ServiceProcess, run_cli, sample_key, service_environment
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("IDENTITY_FANOUT_LAG_WATCH_INTERVAL", "soon", "expected a duration like 250ms"),
        ("IDENTITY_FANOUT_LAG_WATCH_TOPICS", "not a topic", "expected a comma-separated list"),
        ("IDENTITY_FANOUT_LAG_WATCH_MAX_GROUPS", "0", "expected an integer >= 1"),
    ],
)
def test_a_bad_setting_exits_2_naming_the_variable(variable: str, value: str, reason: str) -> None:
    env = service_environment(("IDENTITY_FANOUT_",), **{variable: value})
    result = run_cli("identity-fanout", ["lag-watch"], env, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(f"config error: {variable}: {reason}")
    assert len(result.stderr.splitlines()) == 1


def test_without_bootstrap_it_exits_2_and_never_asks_for_a_database() -> None:
    env = service_environment(("IDENTITY_FANOUT_",))
    result = run_cli("identity-fanout", ["lag-watch"], env, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "config error: IDENTITY_FANOUT_KAFKA_BOOTSTRAP: required by `lag-watch`"
    )


def test_it_discovers_the_groups_of_the_topic_and_exports_their_lag(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = kafka_topic(partitions=3)
    produce(kafka_bootstrap, topic, [(b"k", b"v", [])] * 5, partition=1)
    gateway = f"pin-test-gateway-{uuid.uuid4().hex[:8]}"
    commit_group_offsets(kafka_bootstrap, gateway, topic, {1: 2})
    port = free_port()
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_KAFKA_BOOTSTRAP=kafka_bootstrap,
        IDENTITY_FANOUT_METRICS_HOST="127.0.0.1",
        IDENTITY_FANOUT_METRICS_PORT=str(port),
        IDENTITY_FANOUT_LAG_WATCH_TOPICS=topic,
        IDENTITY_FANOUT_LAG_WATCH_INTERVAL="1s",
        IDENTITY_FANOUT_LAG_WATCH_REQUEST_TIMEOUT="1s",
    )
    with ServiceProcess(
        "lag-watcher", "identity-fanout", ("lag-watch",), env, port, tmp_path / "watcher.log"
    ) as watcher:
        watcher.start()
        watcher.wait_ready()
        labels = {"consumergroup": gateway, "topic": topic}

        def reported() -> bool:
            key = sample_key("kafka_consumergroup_lag", {**labels, "partition": "1"})
            return key in watcher.metrics()

        wait_until(reported, 60, "the discovered group's lag exported", alive=[watcher])
        assert watcher.metric("kafka_consumergroup_lag", partition="1", **labels) == 3
        assert watcher.metric("kafka_consumergroup_lag", partition="0", **labels) == 0
        assert watcher.metric("pin_lag_watcher_groups", topic=topic) == 1
        assert watcher.metric("pin_lag_watcher_last_success_timestamp_seconds", topic=topic) > 0
        assert watcher.terminate() == 0
    assert "DATABASE_DSN" not in watcher.log_text()
