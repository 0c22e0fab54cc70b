"""The consumer against a broker that requires SCRAM over TLS: right credentials work, wrong
ones stop the process at once with one line (and never the password)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from consumer_kit import publish

from pin_contracts import AgentMembershipStatus
from pin_runtime.kafka import create_admin, create_producer, ensure_topics
from pin_runtime.settings import load_settings
from pin_testkit.secured import SecuredKafka, assert_wrong_password_refused
from rewards_membership.settings import ENV_PREFIX, Settings


def _settings(secured: SecuredKafka, database: str, **overrides: str) -> Settings:
    topic, dlq = (f"pin-test.{uuid.uuid4().hex[:12]}" for _ in range(2))
    environ = {
        **secured.environment(ENV_PREFIX),
        f"{ENV_PREFIX}DATABASE_DSN": database,
        f"{ENV_PREFIX}TOPIC": topic,
        f"{ENV_PREFIX}DLQ_TOPIC": dlq,
        f"{ENV_PREFIX}GROUP_ID": f"secured-{uuid.uuid4().hex[:8]}",
        f"{ENV_PREFIX}POLL_TIMEOUT": "200ms",
        f"{ENV_PREFIX}LAG_INTERVAL": "200ms",
        **{f"{ENV_PREFIX}{k}": v for k, v in overrides.items()},
    }
    return load_settings(Settings, ENV_PREFIX, environ)


def test_consumer_applies_events_over_scram_and_tls(
    *,
    secured_kafka: SecuredKafka,
    consumer_dsn: str,
    event: Callable[..., Any],
    rows: Callable[..., list[dict[str, Any]]],
    wait: Callable[..., None],
    start_consumer: Callable[..., Any],
) -> None:
    settings = _settings(secured_kafka, consumer_dsn)
    security = settings.kafka_security()
    admin = create_admin(secured_kafka.bootstrap, client_id="secured-test", extra=security)
    ensure_topics(admin, [(settings.topic, 3), (settings.dlq_topic, 3)])
    agent, agency = uuid.uuid4(), uuid.uuid4()
    producer = create_producer(secured_kafka.bootstrap, client_id="secured-test", extra=security)
    publish(producer, settings.topic, event(agent, agency, 1, AgentMembershipStatus.ACTIVE))

    # The suite's consumer, every setting taken from the secured environment.
    consumer = start_consumer(**msgspec.structs.asdict(settings))
    wait(lambda: len(rows()) == 1, timeout=60, what="the event applied over SASL_SSL")
    consumer.close()
    [row] = rows()
    assert (row["agent_user_id"], row["company_id"], row["membership_status"]) == (
        agent,
        agency,
        "Active",
    )


def test_consume_with_a_wrong_password_stops_at_once_with_one_line(
    secured_kafka: SecuredKafka, consumer_dsn: str
) -> None:
    assert_wrong_password_refused(
        secured_kafka, "rewards-membership", ["consume"], ENV_PREFIX, DATABASE_DSN=consumer_dsn
    )
