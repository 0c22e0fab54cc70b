"""`rewards-membership lag-watch` as the chart runs it, scraped by a real Prometheus loaded
with the repository's rules: with every consumer of the group gone, the lag alert's
condition holds (the alert pending) and so does the consumers' absence alert; once the
group has caught up it no longer holds, without a single new record. A bad setting exits 2.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from pin_contracts import AGENT_MEMBERSHIP_CHANGED, REWARDS_MEMBERSHIP_CONSUMER_GROUP
from pin_testkit.local.prometheus import PrometheusServer
from pin_testkit.local.tools import repo_root
from pin_testkit.ports import free_port
from pin_testkit.private import PrivateKafka
from pin_testkit.records import commit_group_offsets
from pin_testkit.service import ServiceProcess, run_cli, service_environment
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

GROUP = REWARDS_MEMBERSHIP_CONSUMER_GROUP
TOPIC = AGENT_MEMBERSHIP_CHANGED.name
RULES = repo_root() / "infra" / "monitoring" / "rules" / "rewards-membership.rules.yml"


def alert_expr(name: str) -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    (expr,) = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == name]
    return str(expr)


def states(prometheus: PrometheusServer, name: str) -> set[str]:
    return {a["state"] for a in prometheus.alerts() if a["labels"]["alertname"] == name}


def test_a_bad_setting_exits_2_naming_the_variable() -> None:
    env = service_environment(
        ("REWARDS_MEMBERSHIP_",), REWARDS_MEMBERSHIP_LAG_WATCH_STALE_AFTER="5s"
    )
    result = run_cli("rewards-membership", ["lag-watch"], env, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "config error: REWARDS_MEMBERSHIP_LAG_WATCH_STALE_AFTER: must be at least twice "
        "REWARDS_MEMBERSHIP_LAG_WATCH_INTERVAL"
    )


def test_prometheus_sees_the_lag_of_a_group_without_consumers_until_it_catches_up(
    private_kafka: PrivateKafka, tmp_path: Path
) -> None:
    # A broker of this test alone: the real topic and group names, as the rules match them.
    private_kafka.create_topic(TOPIC, partitions=3)
    producer = Producer({"bootstrap.servers": private_kafka.bootstrap, "log_level": 0})
    stamped = time.time() - 900  # records produced 15 minutes ago, never consumed since
    for index in range(4):
        producer.produce(TOPIC, value=b"{}", partition=0, timestamp=int((stamped + index) * 1000))
    assert producer.flush(30) == 0
    commit_group_offsets(private_kafka.bootstrap, GROUP, TOPIC, {0: 1, 1: 0, 2: 0})
    port = free_port()
    env = service_environment(
        ("REWARDS_MEMBERSHIP_",),
        REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP=private_kafka.bootstrap,
        REWARDS_MEMBERSHIP_METRICS_HOST="127.0.0.1",
        REWARDS_MEMBERSHIP_METRICS_PORT=str(port),
        REWARDS_MEMBERSHIP_LAG_WATCH_INTERVAL="1s",
        REWARDS_MEMBERSHIP_LAG_WATCH_REQUEST_TIMEOUT="1s",
    )
    lag_high = alert_expr("RewardsMembershipLagHigh")
    with (
        ServiceProcess(
            "lag-watcher", "rewards-membership", ("lag-watch",), env, port, tmp_path / "w.log"
        ) as watcher,
        PrometheusServer(tmp_path / "prometheus") as prometheus,
    ):
        watcher.start()
        watcher.wait_ready()
        prometheus.scrape("rewards-membership", f"127.0.0.1:{port}")

        def lag_alert_holds() -> list[dict[str, Any]]:
            return prometheus.query(lag_high)

        wait_until(lag_alert_holds, 60, "RewardsMembershipLagHigh's condition", alive=[watcher])
        [sample] = lag_alert_holds()
        assert sample["metric"] == {"namespace": "pin-e2e"}
        assert float(sample["value"][1]) >= 900 - 1  # the record at offset 1: 15 min old
        wait_until(
            lambda: states(prometheus, "RewardsMembershipLagHigh") == {"pending"},
            30,
            "RewardsMembershipLagHigh pending (its `for` is 2 minutes)",
        )
        # Nobody consumes: the consumers' absence alert holds too; the guard does not.
        wait_until(
            lambda: states(prometheus, "RewardsMembershipConsumerAbsent") == {"pending"},
            30,
            "RewardsMembershipConsumerAbsent pending",
        )
        assert states(prometheus, "RewardsMembershipLagUnreported") == set()
        assert states(prometheus, "RewardsMembershipLagWatcherDown") == set()

        # The group commits the end of the partition: no new record is produced.
        commit_group_offsets(private_kafka.bootstrap, GROUP, TOPIC, {0: 4})
        wait_until(lambda: not lag_alert_holds(), 60, "the lag condition gone after catch-up")
        wait_until(
            lambda: states(prometheus, "RewardsMembershipLagHigh") == set(),
            30,
            "RewardsMembershipLagHigh no longer pending",
        )
        [caught_up] = prometheus.query(
            f'max(kafka_consumergroup_lag_seconds{{consumergroup="{GROUP}"}})'
        )
        assert float(caught_up["value"][1]) == 0
        assert watcher.terminate() == 0
