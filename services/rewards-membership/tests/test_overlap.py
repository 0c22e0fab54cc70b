"""Kafka and PostgreSQL overlapped: a batch in its transaction while the next is polled.

The guarantees hold with a batch in flight and a prefetched one: a rebalance loses and
repeats nothing, a failed transaction is replayed from its first records (the prefetched
records behind it are read again), and no offset passes a transaction not yet committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from confluent_kafka import Message, TopicPartition

from pin_contracts import AgentMembershipChanged
from pin_runtime.kafka import create_consumer
from rewards_membership.consumer.batch import Batch
from rewards_membership.consumer.rebalance import RebalanceGuard, reseek_offsets
from rewards_membership.rules.validation import position_key
from rewards_membership.settings import Settings

Event = Callable[..., AgentMembershipChanged]
Sql = Callable[..., list[tuple[Any, ...]]]
Stream = Callable[..., list[AgentMembershipChanged]]


def committed_offsets(settings: Settings) -> dict[int, int]:
    """The group's committed offsets (an offset fetch; it does not join the group)."""
    reader = create_consumer(
        settings.kafka_bootstrap, group_id=settings.group_id, client_id="offset-reader"
    )
    try:
        tps = [TopicPartition(settings.topic, p) for p in range(3)]
        return {tp.partition: tp.offset for tp in reader.committed(tps, timeout=10)}
    finally:
        reader.close()


# -- pure parts -------------------------------------------------------------------------------


def _message(partition: int, offset: int) -> Message:
    return Message(topic="t", partition=partition, offset=offset, value=b"{}")


def _keys(batch: Batch) -> list[str]:
    """The inbox keys of the batch statement's document, in order."""
    return [record["key"] for record in msgspec.json.decode(batch.document())]


def test_a_batch_is_each_partitions_records_in_offset_order_encoded_once() -> None:
    records = [_message(0, 5), _message(1, 9), _message(0, 6), _message(0, 7)]
    batch = Batch.of(records, poll_started=0, polled=0)
    assert {p: (part.first, part.last) for p, part in batch.parts.items()} == {
        0: (5, 7),
        1: (9, 9),
    }
    assert [r.position for r in batch.records()] == [(0, 5), (0, 6), (0, 7), (1, 9)]
    # The statement's document is the parts' documents joined, in the records' order.
    assert _keys(batch) == [position_key("t", p, o) for p, o in [(0, 5), (0, 6), (0, 7), (1, 9)]]
    assert batch.document([1]) == batch.parts[1].document


def test_the_prefetch_keeps_only_partitions_still_ours_in_order() -> None:
    records = [_message(0, 5), _message(1, 9), _message(0, 6), _message(2, 1)]
    batch = Batch.of(records, poll_started=0, polled=0)
    batch.keep(lambda p: True)
    assert len(batch) == 4
    batch.keep(lambda p: p != 0)
    assert [r.position for r in batch.records()] == [(1, 9), (2, 1)]
    assert _keys(batch) == [position_key("t", 1, 9), position_key("t", 2, 1)]


def test_dropped_records_of_a_partition_back_again_are_sought_to_the_first_of_them() -> None:
    records = [_message(0, 5), _message(1, 9), _message(0, 6), _message(2, 1)]
    # 0 revoked and assigned back in the same poll, 1 revoked for good, 2 untouched; a paused
    # partition keeps the position its pause sought it to.
    assert reseek_offsets(records, {0, 1}, assigned={0, 2}, paused=set()) == {0: 5}
    assert reseek_offsets(records, {0, 1}, assigned={0, 2}, paused={0}) == {}


# -- real Kafka and PostgreSQL -----------------------------------------------------------------

BACKLOG = 30_000
"""Records ahead of the consumers while the second one joins: more than one consumer works
through before the rebalance reaches it (design notes "Tests", `test_overlap.py`)."""


@pytest.mark.integration
def test_a_rebalance_with_a_batch_in_flight_loses_and_repeats_nothing(
    *,
    kafka: Any,
    settings: Settings,
    start_consumer: Any,
    wait: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    stream: Stream,
    assert_applied_once_each: Callable[..., None],
) -> None:
    revokes: list[bool] = []
    on_revoke = RebalanceGuard.on_revoke

    def watched(self: RebalanceGuard, consumer: Any, partitions: Any) -> None:
        # The revoke callback: was a batch in its transaction then?
        revokes.append(self.batches.in_flight is not None)
        on_revoke(self, consumer, partitions)

    monkeypatch.setattr(RebalanceGuard, "on_revoke", watched)
    # The first consumer must still be busy when the rebalance reaches it (within a few
    # heartbeats of the second one's join). Topping the topic up as it is consumed cannot
    # ensure that: the consumer drains records faster than the test produces them, and a
    # revoke then finds it idle (it did, against services that had run for hours). So the
    # backlog is there before the second one joins, and topped up while it lasts.
    available = stream(agents=400, versions=200)  # 80,000 events
    payloads = available[:BACKLOG]
    kafka.send(*payloads)
    first = start_consumer(batch_size=50)
    first.wait_handled(300)
    second = start_consumer(batch_size=50)

    def fed_until_taken_over() -> bool:
        if second.consumer.assigned_partitions and revokes:
            return True
        if len(payloads) - (first.handled + second.handled) < BACKLOG // 2:
            more = available[len(payloads) : len(payloads) + BACKLOG // 2]
            assert more, "the first consumer was never asked to give partitions up"
            kafka.send(*more)
            payloads.extend(more)
        return False

    wait(fed_until_taken_over, timeout=120, what="the second consumer took partitions over")
    wait(
        lambda: first.handled + second.handled >= len(payloads),
        timeout=120,
        what="every event handled by the two consumers",
    )
    # The first consumer gave partitions up while a batch of them was in its transaction
    # (and the next one polled): that batch was finished and committed before they moved.
    assert any(revokes)
    assert first.handled + second.handled == len(payloads)
    # No redelivery at all: the second consumer started exactly after what the first applied.
    duplicates = "rewards_membership_skipped_duplicate_total"
    assert first.total(duplicates) + second.total(duplicates) == 0
    assert_applied_once_each(payloads)
    first.close()
    second.close()
    assert sum(committed_offsets(settings).values()) == len(payloads)


@pytest.mark.integration
def test_a_failed_transaction_with_the_next_batch_polled_replays_and_commits_nothing_early(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    sql: Sql,
    locked_row: Callable[[uuid.UUID, uuid.UUID], psycopg.Connection[Any]],
    states: Sql,
    settings: Settings,
    wait: Callable[..., None],
    stream: Stream,
) -> None:
    blocked_agent, company = uuid.uuid4(), uuid.uuid4()
    blocked = event(blocked_agent, company, 2, "Left", reason="SelfLeave")
    payloads = stream(agents=60, versions=10)
    # The batch holding `blocked` waits on a row lock held here (and fails at the lock
    # timeout, again and again); the records behind it are polled meanwhile.
    records = [*payloads[:40], blocked, *payloads[40:]]
    blocker = locked_row(blocked_agent, company)
    envelopes = kafka.send(*records)
    blocked_key = f"rewards:identity-membership:{envelopes[40].message_id}"
    consumer = start_consumer(batch_size=50, db_lock_timeout=timedelta(seconds=1))
    for attempt in (1, 2, 3):
        wait(
            lambda attempt=attempt: (
                consumer.value("rewards_membership_retries_total", dependency="postgresql")
                >= attempt
            ),
            what=f"the blocked batch failed (attempt {attempt})",
        )
        # An offset never passes a transaction that did not commit: every record below
        # the committed offsets has its inbox mark (all records are valid and distinct).
        committed = sum(max(0, o) for o in committed_offsets(settings).values())
        (marks,) = sql("SELECT count(*) FROM rewards.inbox")[0]
        assert committed <= marks
        assert sql(
            "SELECT count(*) FROM rewards.inbox WHERE idempotency_key = %s", (blocked_key,)
        ) == [(0,)]
    assert consumer.handled < len(records)
    blocker.rollback()
    consumer.wait_handled(len(records), timeout=120)
    wait(lambda: consumer.consumer.database_state().status == "ok", what="ready again")
    # Each record reported once: the failed batch and the records polled behind it were
    # read again and applied once, none twice.
    assert consumer.handled == len(records)
    assert consumer.total("rewards_membership_applied_total") == len(records)
    consumer.close()
    assert sum(committed_offsets(settings).values()) == len(records)
    assert states(blocked_agent) == [("Left", 2, 2)]
    others = sql(
        "SELECT agent_user_id, version, last_membership_version"
        " FROM rewards.agent_performance WHERE agent_user_id <> %s",
        (blocked_agent,),
    )
    assert sorted((v, last) for _, v, last in others) == [(10, 10)] * 60
    (marks,) = sql("SELECT count(*) FROM rewards.inbox")[0]
    assert marks == len(records)
