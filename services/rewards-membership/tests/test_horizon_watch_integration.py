"""The consumer process exports the age and holder of the rewards database's oldest snapshot
(`pin_runtime.horizon`), as its runtime login sees it: another role's snapshot shows through
the consumer role's `pg_read_all_stats` membership, granted by migrate."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pin_runtime.horizon import DEFAULT_INTERVAL
from pin_testkit.ports import free_port
from pin_testkit.service import ServiceProcess, service_environment
from pin_testkit.waiting import wait_until
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

HELD = 5.0


def test_the_consumer_shows_a_snapshot_held_on_its_database_and_who_holds_it(
    database: str, consumer_dsn: str, settings: Settings, kafka: Any, tmp_path: Path
) -> None:
    port = free_port()
    env = service_environment(
        ("REWARDS_MEMBERSHIP_",),
        REWARDS_MEMBERSHIP_DATABASE_DSN=consumer_dsn,
        REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        REWARDS_MEMBERSHIP_TOPIC=settings.topic,
        REWARDS_MEMBERSHIP_DLQ_TOPIC=settings.dlq_topic,
        REWARDS_MEMBERSHIP_GROUP_ID=settings.group_id,
        REWARDS_MEMBERSHIP_METRICS_HOST="127.0.0.1",
        REWARDS_MEMBERSHIP_METRICS_PORT=str(port),
    )
    consumer = ServiceProcess(
        "consumer", "rewards-membership", ("consume",), env, port, tmp_path / "consumer.log"
    )
    with (
        psycopg.connect(database, application_name="held-snapshot") as holder,
        consumer.start(),
    ):
        consumer.wait_ready()
        name = str(holder.info.dbname)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        held_at = time.monotonic()
        pid = str(holder.info.backend_pid)

        def held() -> dict[str, float]:
            return {
                key: value
                for key, value in consumer.metrics().items()
                if key.startswith("pin_postgres_oldest_xmin_holder_info{")
                and f'holder="{pid}"' in key
            }

        def age() -> float:
            return consumer.metric("pin_postgres_oldest_xmin_age_seconds", database=name)

        wait_until(
            lambda: age() >= HELD and held(),
            HELD + 3 * DEFAULT_INTERVAL,
            "the consumer's gauge reaching the held time, naming the holder",
            alive=[consumer],
        )
        assert age() <= time.monotonic() - held_at + 1.0
        [labels] = held()
        assert 'application_name="held-snapshot"' in labels
        assert 'state="idle in transaction"' in labels
        assert 'kind="session"' in labels
        holder.rollback()
        wait_until(
            lambda: age() < HELD and not held(),
            3 * DEFAULT_INTERVAL,
            "the gauge dropping back once released",
            alive=[consumer],
        )
