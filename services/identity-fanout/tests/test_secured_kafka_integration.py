"""The relay against a broker that requires SCRAM over TLS: right credentials publish, wrong
ones stop the process at once with one line (and never the password); a topic it may not
write (an ACL) pauses it, quarantining nothing, until the permission is back."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow
from relay_support import (
    RELAY_TEST_OPTIONS,
    RelayThread,
    access_event,
    access_topic,
    new_relay,
    outbox_count,
    write,
)

from identity_fanout.app import outbox_relay
from identity_fanout.membership import join_agency
from identity_fanout.outbox.writer import outbox_message
from identity_fanout.settings import ENV_PREFIX, Settings
from pin_contracts import AGENT_MEMBERSHIP_CHANGED, decode_access_changed, decode_membership_changed
from pin_runtime.http import ComponentState
from pin_runtime.kafka import create_admin, create_consumer, ensure_topics
from pin_runtime.settings import load_settings
from pin_testkit.ports import free_port
from pin_testkit.private import PrivateKafka
from pin_testkit.records import read_messages
from pin_testkit.secured import (
    ScramLogin,
    SecuredKafka,
    TopicAcls,
    assert_wrong_password_refused,
)
from pin_testkit.service import ServiceProcess, service_environment
from pin_testkit.waiting import wait_until

USERS = 40
VERSIONS = 3


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

    with outbox_relay(settings, registry=CollectorRegistry()) as relay:
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


def test_a_topic_the_relay_may_not_write_pauses_it_and_every_row_follows_in_order(
    secured_kafka: SecuredKafka,
    relay_dsn: str,
    identity_dsn: str,
    db: psycopg.Connection[TupleRow],
    json_logs: io.StringIO,
) -> None:
    settings = load_settings(
        Settings,
        ENV_PREFIX,
        {**secured_kafka.environment(ENV_PREFIX), f"{ENV_PREFIX}DATABASE_DSN": relay_dsn},
    )
    security = settings.kafka_security()
    topic = access_topic(f"pin-test.acl.{uuid.uuid4().hex[:12]}")
    admin = create_admin(secured_kafka.bootstrap, client_id="secured-test", extra=security)
    ensure_topics(admin, [(topic.name, topic.partitions, topic.config())])
    users = [uuid.uuid4() for _ in range(USERS)]
    # Every user's versions in order, interleaved across users (as successive changes are).
    write(
        identity_dsn,
        [outbox_message(access_event(u, v), topic) for v in range(1, VERSIONS + 1) for u in users],
    )
    rows = USERS * VERSIONS
    acl = TopicAcls(secured_kafka, topic.name)
    acl.deny()  # an ACL mistake: the relay's principal lost WRITE on the topic

    registry, state = CollectorRegistry(), ComponentState()
    relay = new_relay(
        relay_dsn,
        secured_kafka.bootstrap,
        registry=registry,
        state=state,
        settings=settings,
        # A read cooldown far longer than the first backoff: the retries of the refused rows
        # must not wait for it, nor may a step inside it lift the pause.
        **RELAY_TEST_OPTIONS | {"poll_interval": 0.2, "read_cooldown": 2.0},
    )
    paused = {"reason": "topic-authorization", "topic": topic.name}

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    with RelayThread(relay):
        wait_until(
            lambda: sample("identity_outbox_relay_paused", **paused) == 1, 30, "relay paused"
        )
        pause = relay.pause
        # It keeps retrying (every row refused again, each time), and keeps every row.
        wait_until(
            lambda: sample("identity_outbox_delivery_failures_total") >= 3,
            30,
            "three refused retries",
        )
        assert outbox_count(identity_dsn) == rows
        assert db.execute("SELECT count(*) FROM identity.outbox_quarantine").fetchone() == (0,)
        assert sample("identity_outbox_quarantined_total") == 0
        assert sample("identity_outbox_published_total") == 0
        assert state().status == "degraded"
        assert "TOPIC_AUTHORIZATION_FAILED" in state().detail
        assert pause is not None
        assert pause.topic == topic.name
        assert relay.pause is pause  # the same pause throughout its retries

        acl.allow_again()
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "every row published")
        wait_until(lambda: relay.pause is None, 10, "relay resumed")
        assert sample("identity_outbox_relay_paused", **paused) == 0
        assert sample("identity_outbox_published_total") == rows
        wait_until(lambda: state().status == "ok", 10, "ready again")

    versions: defaultdict[uuid.UUID, list[int]] = defaultdict(list)
    for message in read_messages(secured_kafka.plaintext_bootstrap, topic.name):
        event = decode_access_changed(message.value() or b"")
        versions[event.payload.user_id].append(event.payload.version)
    # Every row of every user, each user's in order (duplicates of a retry allowed).
    for user in users:
        assert sorted(set(versions[user])) == list(range(1, VERSIONS + 1)), user
        assert versions[user] == sorted(versions[user]), user
    assert db.execute("SELECT count(*) FROM identity.outbox_quarantine").fetchone() == (0,)

    lines = [json.loads(line) for line in json_logs.getvalue().splitlines() if line.strip()]
    [pause] = [line for line in lines if line["event"] == "relay paused"]
    [resume] = [line for line in lines if line["event"] == "relay resumed"]
    assert (pause["level"], pause["errorCode"], pause["topic"]) == (
        "ERROR",
        "TOPIC_AUTHORIZATION_FAILED",
        topic.name,
    )
    assert (resume["reason"], resume["topic"]) == ("topic-authorization", topic.name)
    assert resume["pausedSeconds"] > 0
    assert not [line for line in lines if line["event"] == "outbox delivery failed"]


FIRST_PASSWORD = "first-Kafka-Secret-1"
ROTATED_PASSWORD = "second-Kafka-Secret-2"


@pytest.fixture(scope="module")
def restartable_secured_kafka() -> Iterator[PrivateKafka]:
    """A secured broker of this module's own, which a test may restart (the run's shared
    one serves every other test)."""
    with PrivateKafka.launch(secure=True) as broker:
        yield broker


def test_a_rotated_sasl_password_file_rebuilds_the_relays_producer_without_a_restart(
    restartable_secured_kafka: PrivateKafka,
    relay_dsn: str,
    identity_dsn: str,
    json_logs: io.StringIO,
    tmp_path: Path,
) -> None:
    broker = restartable_secured_kafka
    secured = broker.secured
    login = ScramLogin(secured, f"pin-rotate-{uuid.uuid4().hex[:10]}")
    login.set_password(FIRST_PASSWORD)
    secret = tmp_path / "kafka-password"
    secret.write_text(FIRST_PASSWORD + "\n")
    secret.chmod(0o640)  # a Secret volume's file under the pod's fsGroup
    settings = load_settings(
        Settings,
        ENV_PREFIX,
        {**login.environment(ENV_PREFIX, secret), f"{ENV_PREFIX}DATABASE_DSN": relay_dsn},
    )
    topic = access_topic(f"pin-test.rotate.{uuid.uuid4().hex[:12]}")
    admin = create_admin(secured.plaintext_bootstrap, client_id="secured-test")
    ensure_topics(admin, [(topic.name, topic.partitions, topic.config())])
    registry, state = CollectorRegistry(), ComponentState()
    relay = new_relay(
        relay_dsn,
        secured.bootstrap,
        registry=registry,
        state=state,
        settings=settings,
        **RELAY_TEST_OPTIONS | {"poll_interval": 0.2, "delivery_timeout": 5.0},
    )

    def published() -> float:
        return registry.get_sample_value("identity_outbox_published_total") or 0.0

    with RelayThread(relay):
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "published as the user")

        # The password changes on the broker first; the Secret volume shows it later. A
        # connection authenticated before stays so (the broker checks a password at login):
        # the broker's restart makes the producer log in again, refused.
        login.set_password(ROTATED_PASSWORD)
        broker.stop()
        broker.start()
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        wait_until(
            lambda: relay.pause is not None and relay.pause.failure.reason == "authentication",
            60,
            "the relay paused for its refused login",
        )
        assert outbox_count(identity_dsn) == 3  # every row kept meanwhile
        assert published() == 3

        secret.write_text(ROTATED_PASSWORD + "\n")
        secret.chmod(0o640)
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "published after the rotation")
        wait_until(lambda: relay.pause is None, 10, "relay resumed")
        # The counter follows the delete's commit, in the relay's thread.
        wait_until(lambda: published() >= 6, 10, "the rotated login's rows counted")
        wait_until(lambda: state().status == "ok", 10, "ready again")
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines() if line.strip()]
    rebuilt = [
        e for e in lines if e["event"] == "kafka producer rebuilt with the rotated SASL password"
    ]
    assert len(rebuilt) == 1
    assert FIRST_PASSWORD not in json_logs.getvalue()
    assert ROTATED_PASSWORD not in json_logs.getvalue()


def test_a_rotated_sasl_password_file_rebuilds_the_lag_watchers_clients_without_a_restart(
    restartable_secured_kafka: PrivateKafka, tmp_path: Path
) -> None:
    broker = restartable_secured_kafka
    secured = broker.secured
    login = ScramLogin(secured, f"pin-rotate-{uuid.uuid4().hex[:10]}")
    login.set_password(FIRST_PASSWORD)
    secret = tmp_path / "kafka-password"
    secret.write_text(FIRST_PASSWORD + "\n")
    secret.chmod(0o640)
    topic = f"pin-test.rotate.{uuid.uuid4().hex[:12]}"
    ensure_topics(create_admin(secured.plaintext_bootstrap, client_id="secured-test"), [(topic, 3)])
    port = free_port()
    env = service_environment(
        (ENV_PREFIX,),
        **login.environment(ENV_PREFIX, secret),
        **{
            f"{ENV_PREFIX}METRICS_HOST": "127.0.0.1",
            f"{ENV_PREFIX}METRICS_PORT": str(port),
            f"{ENV_PREFIX}LAG_WATCH_TOPICS": topic,
            f"{ENV_PREFIX}LAG_WATCH_INTERVAL": "1s",
            f"{ENV_PREFIX}LAG_WATCH_REQUEST_TIMEOUT": "1s",
        },
    )
    watcher = ServiceProcess(
        "lag-watcher", "identity-fanout", ("lag-watch",), env, port, tmp_path / "watcher.log"
    )

    def last_success() -> float:
        return watcher.metric("pin_lag_watcher_last_success_timestamp_seconds", topic=topic)

    try:
        with watcher.start():
            watcher.wait_ready()
            wait_until(lambda: last_success() > 0, 60, "a pass as the user", alive=[watcher])

            login.set_password(ROTATED_PASSWORD)
            broker.stop()
            broker.start()
            wait_until(lambda: not watcher.ready(), 60, "not ready: login refused", alive=[watcher])
            refused_since = time.time()

            secret.write_text(ROTATED_PASSWORD + "\n")
            secret.chmod(0o640)
            wait_until(
                lambda: last_success() > refused_since,
                90,
                "a pass after the rotation",
                alive=[watcher],
            )
            wait_until(watcher.ready, 30, "ready again", alive=[watcher])
            assert watcher.terminate() == 0  # the one run there was, stopped here
    finally:
        login.delete()
    log = watcher.log_text()
    assert log.count("kafka clients rebuilt with the rotated SASL password") == 1
    assert FIRST_PASSWORD not in log
    assert ROTATED_PASSWORD not in log
