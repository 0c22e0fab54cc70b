"""The relay against a broker that requires SCRAM over TLS: right credentials publish, wrong
ones stop the process at once with one line (and never the password)."""

from __future__ import annotations

import time
import uuid

import psycopg
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from prometheus_client import CollectorRegistry

from identity_fanout.membership import join_agency
from identity_fanout.relay import relay_from_settings
from identity_fanout.settings import ENV_PREFIX, Settings
from pin_contracts import AGENT_MEMBERSHIP_CHANGED, decode_membership_changed
from pin_runtime.kafka import create_admin, create_consumer, ensure_topics
from pin_runtime.settings import load_settings
from pin_testkit.secured import SecuredKafka, assert_wrong_password_refused


def test_relay_publishes_over_scram_and_tls(
    secured_kafka: SecuredKafka, producer_dsn: str, relay_dsn: str
) -> None:
    settings = load_settings(
        Settings,
        ENV_PREFIX,
        {**secured_kafka.environment(ENV_PREFIX), f"{ENV_PREFIX}DATABASE_DSN": relay_dsn},
    )
    security = settings.kafka_security()
    admin = create_admin(secured_kafka.bootstrap, client_id="secured-test", extra=security)
    topic = AGENT_MEMBERSHIP_CHANGED
    ensure_topics(admin, [(topic.name, topic.partitions, topic.config())])
    agent = uuid.uuid4()
    with psycopg.connect(producer_dsn) as conn:
        join_agency(conn, agent, uuid.uuid4())

    with relay_from_settings(settings, registry=CollectorRegistry()) as relay:
        assert relay.run_once() == 1

    consumer = create_consumer(
        secured_kafka.bootstrap,
        group_id=f"secured-{uuid.uuid4().hex[:8]}",
        client_id="secured-test",
        extra=security,
    )
    try:
        partitions = admin.list_topics(topic.name, timeout=10).topics[topic.name].partitions
        consumer.assign([TopicPartition(topic.name, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + 30
        found = None
        while found is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if (
                message is not None
                and message.error() is None
                and message.key() == str(agent).encode()
            ):
                found = decode_membership_changed(message.value())
    finally:
        consumer.close()
    assert found is not None
    assert found.payload.agent_user_id == agent


def test_relay_with_a_wrong_password_stops_at_once_with_one_line(
    secured_kafka: SecuredKafka, relay_dsn: str
) -> None:
    assert_wrong_password_refused(
        secured_kafka, "identity-fanout", ["relay"], ENV_PREFIX, DATABASE_DSN=relay_dsn
    )
