"""Reading and writing records of real topics: from offsets to the end as of the call."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from pin_testkit.records import (
    commit_group_offsets,
    consume,
    end_offsets,
    produce,
    read_messages,
    read_topic,
)

pytestmark = pytest.mark.integration


def test_read_topic_returns_what_was_written_after_the_given_offsets(
    kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=2)
    assert end_offsets(kafka_bootstrap, topic) == {0: 0, 1: 0}
    assert read_topic(kafka_bootstrap, topic) == []
    early = produce(kafka_bootstrap, topic, [(b"k", b"early", [])], partition=0)
    start = end_offsets(kafka_bootstrap, topic)
    assert start == {0: 1, 1: 0}
    later = produce(
        kafka_bootstrap,
        topic,
        [(b"a", b"one", [("h", b"1")]), (b"b", b"two", [])],
        partition=1,
    )
    assert [d.offset for d in (*early, *later)] == [0, 0, 1]
    records = read_topic(kafka_bootstrap, topic, start)
    assert [(r.partition, r.offset, r.key, r.value) for r in records] == [
        (1, 0, b"a", b"one"),
        (1, 1, b"b", b"two"),
    ]
    assert records[0].headers == [("h", b"1")]
    assert [m.value() for m in read_messages(kafka_bootstrap, topic)] == [
        b"early",
        b"one",
        b"two",
    ]


def test_consume_fails_unless_the_count_arrives(
    kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=1)
    produce(kafka_bootstrap, topic, [(None, b"x", []), (None, b"y", [])])
    assert [m.value() for m in consume(kafka_bootstrap, topic, 2)] == [b"x", b"y"]
    with pytest.raises(AssertionError, match="2 of 3 records within 1s"):
        consume(kafka_bootstrap, topic, 3, timeout=1)


def test_committed_group_offsets_are_where_the_group_starts(
    kafka_bootstrap: str, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic(partitions=1)
    produce(kafka_bootstrap, topic, [(None, b"old", []), (None, b"new", [])])
    group = f"pin-test-{uuid.uuid4().hex[:8]}"
    commit_group_offsets(kafka_bootstrap, group, topic, {0: 1})
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    assert committed.offset == 1
