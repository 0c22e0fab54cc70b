"""Fuzzing the relay's whole path: outbox rows with arbitrary keys, headers and sizes, through
the real relay to a real broker. Each row is published byte for byte or, when the broker
refuses it for good, quarantined; no row ever blocks the outbox.

A few hundred examples in `make test`; `make fuzz` runs ten thousand (PIN_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Final

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from hypothesis import given
from hypothesis import strategies as st
from psycopg.rows import TupleRow
from relay_support import new_relay

from identity_fanout.outbox.writer import OutboxMessage
from identity_fanout.schema import OUTBOX
from pin_contracts import AGENT_MEMBERSHIP_CHANGED
from pin_runtime.kafka import record_headers
from pin_testkit.fuzzing import fuzz_settings, fuzz_timeout

pytestmark = [pytest.mark.integration, pytest.mark.timeout(fuzz_timeout())]

Conn = psycopg.Connection[TupleRow]
TOPIC_LIMIT: Final = AGENT_MEMBERSHIP_CHANGED.max_message_bytes  # 1 MiB
FUZZ_HEADER: Final = "fuzz-row"
PARTITIONS: Final = 3

# Text PostgreSQL stores (no NUL) and Kafka carries (no lone surrogates).
texts = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=80)
sizes = st.one_of(
    st.integers(min_value=0, max_value=64 * 1024),  # published
    st.integers(min_value=TOPIC_LIMIT + 64 * 1024, max_value=TOPIC_LIMIT + 512 * 1024),  # refused
)


@st.composite
def rows(draw: st.DrawFn, topic: str) -> OutboxMessage:
    size = draw(sizes)
    # Random bytes no codec shrinks: the size the broker compares is the size drawn.
    value = random.Random(draw(st.integers(0, 2**32))).randbytes(size)
    row_id = uuid.uuid4()
    headers = draw(st.lists(st.tuples(texts, texts), max_size=5))
    return OutboxMessage(
        topic=topic,
        key=draw(texts),
        value=value,
        headers=(*headers, (FUZZ_HEADER, str(row_id))),
        message_id=row_id,
        event_type=draw(st.sampled_from(["UserAccessChanged", "AgentMembershipChanged"])),
    )


def count(db: Conn, table: str) -> int:
    row = db.execute(f"SELECT count(*) FROM identity.{table}").fetchone()
    assert row is not None
    return int(row[0])


Published = dict[str, tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]


def read_topic(bootstrap: str, topic: str) -> Published:
    """Every record of `topic` by its fuzz-row header: (key, value, headers)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "fuzz-reader", "enable.partition.eof": True}
    )
    found: Published = {}
    try:
        consumer.assign([TopicPartition(topic, p, -2) for p in range(PARTITIONS)])
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"{topic} not read to its end"
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition() or 0)
                continue
            headers = [
                (k, v.encode() if isinstance(v, str) else v or b"")
                for k, v in record_headers(message)
            ]
            row = next(v for k, v in headers if k == FUZZ_HEADER)
            found[row.decode()] = (message.key(), message.value(), headers)
    finally:
        consumer.close()
    return found


def test_any_outbox_row_is_published_or_quarantined_and_never_blocks(
    db: Conn, relay_dsn: str, kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=PARTITIONS, config=AGENT_MEMBERSHIP_CHANGED.config())
    relay = new_relay(
        relay_dsn,
        kafka_bootstrap,
        delivery_timeout=20.0,
        poll_interval=0.05,
        lock_retry_interval=0.1,
        backoff_initial=0.05,
        backoff_maximum=0.2,
    )
    written: list[OutboxMessage] = []

    @fuzz_settings()
    @given(batch=st.lists(rows(topic), min_size=1, max_size=4))
    def example(batch: list[OutboxMessage]) -> None:
        with db.transaction():
            OUTBOX.write(db, batch)
        written.extend(batch)
        deadline = time.monotonic() + 30
        while count(db, "outbox"):  # never blocks: the outbox empties every time
            assert time.monotonic() < deadline, relay.last_round
            relay.run_once()

    try:
        example()
    finally:
        relay.close()
    quarantined = {
        str(message_id): reason
        for message_id, reason in db.execute(
            "SELECT message_id, error_reason FROM identity.outbox_quarantine"
        )
    }
    published = read_topic(kafka_bootstrap, topic)
    for message in written:
        row = str(message.message_id)
        if len(message.value) > TOPIC_LIMIT:
            assert quarantined.get(row) == "too-large", row
            assert row not in published
            continue
        assert row not in quarantined, quarantined[row]
        key, value, headers = published[row]  # published byte for byte
        assert key == message.key.encode()
        assert value == message.value
        assert [(k, v.decode()) for k, v in headers] == [(k, v) for k, v in message.headers]
    assert len(quarantined) == sum(len(m.value) > TOPIC_LIMIT for m in written)
