from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Message, TopicPartition
from confluent_kafka.admin import AdminClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.kafka import (
    create_admin,
    create_consumer,
    create_producer,
    ensure_topics,
    read_headers,
    record_headers,
)
from pin_runtime.tracing import Headers, extract_context, inject_headers
from pin_testkit.kafka_wire import WireRecord, produce_wire

pytestmark = pytest.mark.integration


@pytest.fixture
def admin(kafka_bootstrap: str) -> AdminClient:
    return create_admin(kafka_bootstrap, client_id="pin-runtime-test-admin")


@pytest.fixture
def new_topic(admin: AdminClient) -> Iterator[str]:
    """A name no topic has yet; deleted after the test whoever created it."""
    name = f"pin-runtime-test-{uuid.uuid4().hex[:12]}"
    yield name
    for future in admin.delete_topics([name], operation_timeout=30).values():
        future.result(30)


def poll_one(consume: Callable[[float], Message | None], timeout: float) -> Message:
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        message = consume(min(remaining, 1.0))
        if message is None:
            continue
        assert message.error() is None, message.error()
        return message
    pytest.fail(f"no message within {timeout}s")


def test_ensure_topics_creates_once_and_waits_for_leaders(
    admin: AdminClient, new_topic: str, kafka_topic: Callable[..., str]
) -> None:
    existing = kafka_topic(partitions=1)
    assert ensure_topics(admin, [(new_topic, 3), (existing, 1)]) == [new_topic]
    metadata = admin.list_topics(timeout=10).topics
    assert len(metadata[new_topic].partitions) == 3
    assert ensure_topics(admin, [(new_topic, 3)]) == []  # second run: nothing to do


def test_round_trip_with_headers_and_trace_context(
    kafka_bootstrap: str, admin: AdminClient, new_topic: str
) -> None:
    ensure_topics(admin, [(new_topic, 3)])
    tracer = TracerProvider().get_tracer("pin-runtime-test")
    producer = create_producer(kafka_bootstrap, client_id="pin-runtime-test-producer")
    tracker = DeliveryTracker[int]()
    headers: Headers = [("MessageId", b"m-1"), ("content-type", b"application/json")]
    with tracer.start_as_current_span("publish") as span:
        inject_headers(headers)
        producer.produce(
            new_topic, key=b"user-1", value=b'{"ok":true}', headers=headers, on_delivery=tracker
        )
    flush_or_raise(producer, 30, tracker)
    assert tracker.delivered == 1

    group = f"pin-runtime-test-{uuid.uuid4().hex[:8]}"
    consumer = create_consumer(kafka_bootstrap, group_id=group, client_id="pin-runtime-test-c")
    try:
        consumer.subscribe([new_topic])
        message = poll_one(consumer.poll, 60)
        assert (message.key(), message.value()) == (b"user-1", b'{"ok":true}')
        received = dict(record_headers(message))
        assert received["MessageId"] == b"m-1"
        context = trace.get_current_span(
            extract_context(record_headers(message))
        ).get_span_context()
        assert context.trace_id == span.get_span_context().trace_id
        assert context.span_id == span.get_span_context().span_id

        # Nothing is committed until the service says so (after its DB transaction).
        partition_id, offset = message.partition(), message.offset()
        assert partition_id is not None
        assert offset is not None
        partition = TopicPartition(new_topic, partition_id)
        [before] = consumer.committed([partition], timeout=10)
        assert before.offset < 0
        consumer.store_offsets(message=message)
        consumer.commit(asynchronous=False)
        [after] = consumer.committed([partition], timeout=10)
        assert after.offset == offset + 1
    finally:
        consumer.close()


def test_headers_that_cannot_be_read_are_none_and_leave_the_record_usable(
    kafka_bootstrap: str, admin: AdminClient, new_topic: str
) -> None:
    # Header names are bytes on the wire; confluent-kafka decodes them as UTF-8 and, on one
    # that is not, fails in a way that crashed or stopped every reader: records read well
    # for a while (the interpreter has specialised the call by then), then such records.
    ensure_topics(admin, [(new_topic, 1)])
    good: WireRecord = (b"k", b"good", [(b"MessageId", b"m-1"), (b"null", None)])
    bad: WireRecord = (b"k", b"bad", [(b"MessageId", b"m-2"), (b"\xff\xfename", b"v")])
    records = ([good] * 100 + [bad]) * 3
    produce_wire(kafka_bootstrap, new_topic, 0, records)

    group = f"pin-runtime-test-{uuid.uuid4().hex[:8]}"
    consumer = create_consumer(kafka_bootstrap, group_id=group, client_id="pin-runtime-test-c")
    try:
        consumer.subscribe([new_topic])
        messages = [poll_one(consumer.poll, 60) for _ in records]
    finally:
        consumer.close()
    for message in messages:
        first, again = read_headers(message), read_headers(message)
        if message.value() == b"good":
            assert first == again == ([("MessageId", b"m-1"), ("null", None)], None)
            continue
        (headers, unreadable), (headers_again, unreadable_again) = first, again
        assert headers == headers_again == []
        assert unreadable == unreadable_again
        assert unreadable is not None
        assert unreadable.startswith("UnicodeDecodeError: 'utf-8' codec can't decode")
        # The message is whole again: its own getter (no broken list left), ==, the rest.
        assert message.headers() == []
        assert record_headers(message) == []
        assert message != messages[0]
        assert (message.key(), (message.offset() or 0) % 101) == (b"k", 100)
