"""The outbox relay loses nothing when its broker stops for ~10 s and comes back.

Against a broker of this test alone (``private_kafka``): stopping the session broker would
break every other test of the run.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from relay_support import (
    RelayThread,
    access_event,
    access_topic,
    new_relay,
    outbox_count,
)

from identity_fanout.outbox.writer import OutboxMessage, outbox_message
from identity_fanout.schema import OUTBOX
from pin_contracts import (
    MESSAGE_ID_HEADER,
    Topic,
    decode_access_changed,
    header_text,
)
from pin_runtime.http import ComponentState
from pin_runtime.kafka import record_headers
from pin_testkit.private import PrivateKafka
from pin_testkit.records import read_messages
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

DOWN_FOR = 10.0  # how long the broker stays stopped: the scenario, not a wait for a condition
ROWS_PER_TRANSACTION = 20
HOT_ROWS_PER_TRANSACTION = 4  # rows of one user in every transaction: its order is checked
CORRELATION = "relay-broker-restart-test"


def sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name) or 0.0


class Writer:
    """Writes outbox rows in transactions of ``ROWS_PER_TRANSACTION``; remembers each one."""

    def __init__(self, dsn: str, topic: Topic) -> None:
        self.dsn = dsn
        self.topic = topic
        self.hot_user = uuid.uuid4()
        self.hot_versions = 0
        self.written: list[OutboxMessage] = []

    def transactions(self, count: int) -> None:
        for _ in range(count):
            messages = []
            for n in range(ROWS_PER_TRANSACTION):
                if n % (ROWS_PER_TRANSACTION // HOT_ROWS_PER_TRANSACTION) == 0:
                    self.hot_versions += 1
                    event = access_event(
                        self.hot_user, self.hot_versions, correlation_id=CORRELATION
                    )
                else:
                    event = access_event(uuid.uuid4(), 1, correlation_id=CORRELATION)
                messages.append(outbox_message(event, self.topic))
            with psycopg.connect(self.dsn) as conn:  # one transaction, committed on exit
                OUTBOX.write(conn, messages)
            self.written.extend(messages)


def read_topic(bootstrap: str, topic: Topic) -> list[tuple[int, str, int]]:
    """Every record of ``topic`` as (partition, message id, payload version)."""
    records = []
    for message in read_messages(bootstrap, topic.name):
        headers = record_headers(message)
        message_id = header_text(headers, MESSAGE_ID_HEADER) or ""
        version = decode_access_changed(message.value() or b"").payload.version
        records.append((message.partition() or 0, message_id, version))
    return records


def test_relay_loses_nothing_while_the_broker_is_down(
    identity_dsn: str,
    private_kafka: PrivateKafka,
    worker_dsn: str,
    relay_dsn: str,
    operator_dsn: str,
) -> None:
    topic = access_topic(private_kafka.create_topic(partitions=3))
    writer = Writer(worker_dsn, topic)
    registry, state = CollectorRegistry(), ComponentState()
    relay = new_relay(
        relay_dsn,
        private_kafka.bootstrap,
        registry=registry,
        state=state,
        batch_size=10,  # many rounds: the broker goes down between and during them
        poll_interval=0.2,
        delivery_timeout=3.0,
        lock_retry_interval=0.2,
        backoff_initial=0.1,
        backoff_maximum=1.0,
    )
    with RelayThread(relay, "relay-restart"):
        # Flowing: the first rows go out.
        writer.transactions(5)
        wait_until(lambda: outbox_count(identity_dsn) == 0, 30, "the first rows published")
        assert state().status == "ok"

        # A burst, and the broker goes down while the relay works through it.
        writer.transactions(5)
        stopped_at = time.monotonic()
        private_kafka.stop()
        assert private_kafka.refuses_connections()

        # While it is down: the relay reports failures and keeps every row it could not send.
        writer.transactions(2)
        wait_until(
            lambda: sample(registry, "identity_outbox_delivery_failures_total") > 0,
            30,
            "the relay reports failed deliveries",
        )
        wait_until(lambda: state().status == "degraded", 30, "readiness degraded")
        assert "kafka" in state().detail
        writer.transactions(3)
        assert outbox_count(identity_dsn) > 0
        # Hold the broker down for the rest of the scenario's ten seconds.
        time.sleep(max(0.0, stopped_at + DOWN_FOR - time.monotonic()))
        assert outbox_count(identity_dsn) > 0

        private_kafka.start()
        wait_until(lambda: outbox_count(identity_dsn) == 0, 90, "the backlog published")
        wait_until(lambda: state().status == "ok", 30, "readiness ok again")

        # New rows go straight through.
        writer.transactions(1)
        wait_until(lambda: outbox_count(identity_dsn) == 0, 30, "rows after the restart")
        # The gauge follows within a look at the lanes (an idle instance refreshes it at
        # most once a second and at every look).
        wait_until(lambda: sample(registry, "identity_outbox_backlog") == 0, 10, "backlog 0")

    assert outbox_count(identity_dsn) == 0
    # An outage is never a reason to set a row aside: retriable errors only wait.
    quarantined = [
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "identity_outbox_quarantined_total"
    ]
    assert sum(quarantined) == 0
    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        assert OUTBOX.quarantined(conn) == []
    written = writer.written
    assert len(written) == 16 * ROWS_PER_TRANSACTION
    assert sample(registry, "identity_outbox_published_total") >= len(written)

    records = read_topic(private_kafka.bootstrap, topic)
    arrived = {message_id for _, message_id, _ in records}
    missing = {str(m.message_id) for m in written} - arrived
    assert not missing, f"{len(missing)} of {len(written)} messages lost"
    assert len(records) >= len(written)  # duplicates are allowed (at-least-once)
    assert arrived == {str(m.message_id) for m in written}  # and nothing foreign

    # Per-key order: each version of the hot user first arrives after all lower ones, on a
    # single partition. Re-sends after a failure may repeat a run, never skip ahead.
    hot_ids = {
        str(m.message_id): decode_access_changed(m.value).payload.version
        for m in written
        if m.key == str(writer.hot_user)
    }
    hot = [(partition, version) for partition, mid, version in records if mid in hot_ids]
    assert len({partition for partition, _ in hot}) == 1
    first_seen: list[int] = []
    for _, version in hot:
        if version not in first_seen:
            first_seen.append(version)
    assert first_seen == list(range(1, writer.hot_versions + 1))
