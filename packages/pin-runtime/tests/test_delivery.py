from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from pin_runtime.delivery import DeliveryTracker, classify, flush_or_raise
from pin_runtime.errors import DeliveryError

UnreachableProducer = Callable[..., Producer]  # the conftest fixture


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, "too-large"),
        (KafkaError.RECORD_LIST_TOO_LARGE, "too-large"),
        (KafkaError.INVALID_RECORD, "invalid-record"),
        (KafkaError.TOPIC_EXCEPTION, "invalid-topic"),
    ],
)
def test_errors_about_the_record_are_not_retriable(code: int, reason: str) -> None:
    failure = classify(KafkaError(code))
    assert not failure.retriable
    assert not failure.cluster_wide
    assert failure.reason == reason
    assert failure.code == KafkaError(code).name()


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "topic-authorization"),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "cluster-authorization"),
        (KafkaError.SASL_AUTHENTICATION_FAILED, "authentication"),
        (KafkaError._AUTHENTICATION, "authentication"),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown-topic"),
        (KafkaError._UNKNOWN_TOPIC, "unknown-topic"),
    ],
)
def test_refusals_of_the_cluster_are_retriable_and_cluster_wide(code: int, reason: str) -> None:
    # One ACL mistake refuses every record of the topic: never a reason to set one aside.
    failure = classify(KafkaError(code))
    assert (failure.retriable, failure.cluster_wide, failure.reason) == (True, True, reason)
    assert failure.code == KafkaError(code).name()
    assert classify(KafkaException(KafkaError(code))).cluster_wide


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
    ],
)
def test_errors_about_the_path_are_retriable(code: int) -> None:
    failure = classify(KafkaError(code))
    assert failure.retriable
    assert not failure.cluster_wide
    assert failure.reason == "retriable"


def test_exceptions_raised_by_produce_are_classified() -> None:
    assert not classify(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))).retriable
    assert classify(BufferError("Local: Queue full")).retriable


def test_produce_of_a_record_over_message_max_bytes_is_refused_as_too_large(
    unreachable_producer: UnreachableProducer,
) -> None:
    # librdkafka checks the uncompressed size in produce(), before any broker is involved.
    producer = unreachable_producer({"message.max.bytes": 1000})
    tracker: DeliveryTracker[int] = DeliveryTracker()
    on_delivery = tracker.expect(7)
    with pytest.raises(KafkaException) as raised:
        producer.produce("t", b"x" * 5000, on_delivery=on_delivery)
    failure = tracker.refused(7, raised.value)
    assert (failure.reason, failure.retriable) == ("too-large", False)
    assert tracker.pending == 0
    assert tracker.failures == {7: failure}
    assert not tracker.is_acknowledged(7)


def test_tracker_keys_outcomes_by_token_and_bounds_the_wait(
    unreachable_producer: UnreachableProducer,
) -> None:
    producer = unreachable_producer({"message.timeout.ms": 300})
    tracker: DeliveryTracker[str] = DeliveryTracker()
    producer.produce("t", b"v", on_delivery=tracker.expect("a"))
    producer.produce("t", b"v", on_delivery=tracker.expect("b"))
    assert tracker.pending == 2
    ticks: list[None] = []
    assert tracker.wait(producer, 10.0, on_tick=lambda: ticks.append(None)) == 0
    assert ticks
    assert set(tracker.failures) == {"a", "b"}
    assert all(f.code == "_MSG_TIMED_OUT" and f.retriable for f in tracker.failures.values())
    with pytest.raises(DeliveryError, match="2 message"):
        tracker.raise_for_failures()


def test_wait_gives_up_when_told(unreachable_producer: UnreachableProducer) -> None:
    producer = unreachable_producer({"message.timeout.ms": 60000})
    tracker: DeliveryTracker[int] = DeliveryTracker()
    producer.produce("t", b"v", on_delivery=tracker.expect(1))
    assert tracker.wait(producer, 30.0, give_up=lambda: True) == 1
    with pytest.raises(DeliveryError, match="not acknowledged"):
        tracker.raise_for_failures()
    producer.purge()
    producer.poll(0)


def test_flush_or_raise_counts_anonymous_deliveries(
    unreachable_producer: UnreachableProducer,
) -> None:
    producer = unreachable_producer({"message.timeout.ms": 200})
    tracker: DeliveryTracker[int] = DeliveryTracker()
    producer.produce("t", b"v", on_delivery=tracker)
    with pytest.raises(DeliveryError, match="not delivered"):
        flush_or_raise(producer, 10.0, tracker)
    assert tracker.delivered == 0
    assert [f.code for f in tracker.all_failures()] == ["_MSG_TIMED_OUT"]
