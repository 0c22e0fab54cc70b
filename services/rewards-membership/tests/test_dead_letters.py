"""Dead letters that cannot stop the flow: reference records, per-partition pauses, once-only.

Real PostgreSQL and Kafka. Each test creates its own topics with the limits it needs.
"""

from __future__ import annotations

import io
import os
import re
import socket
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from consumer_kit import ConsumerKit, record_of

from pin_contracts import (
    DLT_VALUE_REPLACED_HEADER,
    EMPTY_GUID,
    IDENTITY_MEMBERSHIP_DLQ,
    DeadLetterInfo,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)
from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.kafka import create_admin, create_consumer, create_producer, ensure_topics
from pin_testkit import fixtures
from rewards_membership.cli import main
from rewards_membership.dlq.reference import DeadLetterReference, decode_reference, sha256_hex
from rewards_membership.dlq.topic import DeadLetterRecord, read_at, read_dead_letters
from rewards_membership.dlq.writer import DeadLetterer
from rewards_membership.ops.status import consumer_status
from rewards_membership.records import Record
from rewards_membership.rules.validation import InvalidEvent, validate
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

Event = Callable[..., Any]
Sql = Callable[..., list[tuple[Any, ...]]]
SOURCE_LIMIT = 4 * 1024 * 1024
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"

json_logs = fixtures.json_logs("rewards_membership", "rewards-membership")


def big_producer(bootstrap: str) -> Producer:
    return create_producer(
        bootstrap,
        client_id="rm-dead-letter-tests",
        linger_ms=1,
        extra={"message.max.bytes": SOURCE_LIMIT},
    )


def produce(
    producer: Producer, topic: str, records: list[tuple[int, bytes | None, bytes | None, Any]]
) -> None:
    """(partition, key, value, headers) each, acknowledged before returning."""
    tracker = DeliveryTracker[int]()
    for partition, key, value, headers in records:
        producer.produce(
            topic,
            partition=partition,
            key=key,
            value=value,
            headers=headers or [],
            on_delivery=tracker,
        )
    flush_or_raise(producer, 30.0, tracker)


def valid(
    event: Event, partition: int, version: int = 1
) -> tuple[int, bytes | None, bytes | None, Any]:
    return (partition, *record_of(envelope_for(event(uuid.uuid4(), uuid.uuid4(), version))))


def poison(
    raw: Callable[..., bytes], event: Event, partition: int, padding: int, **envelope: Any
) -> Any:
    """Empty CompanyId (invalid) plus an unknown field of `padding` incompressible bytes;
    `envelope`: other envelope fields (a CorrelationId)."""
    agent = uuid.uuid4()
    payload = event(agent, EMPTY_GUID, 1, membership_id=uuid.uuid4())
    value = raw(payload, Padding=os.urandom(padding // 2).hex(), **envelope)
    return (partition, str(agent).encode(), value, headers_for(envelope_for(payload)))


def dead_letters(bootstrap: str, topic: str) -> list[DeadLetterRecord]:
    reader = create_consumer(bootstrap, group_id="dlq-reader", client_id="dlq-reader-test")
    try:
        return list(read_dead_letters(reader, topic, timeout=10))
    finally:
        reader.close()


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    reader = create_consumer(bootstrap, group_id=group, client_id="committed-reader")
    try:
        tps = reader.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        reader.close()


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    reader = create_consumer(bootstrap, group_id="watermarks", client_id="watermarks")
    try:
        return {
            p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(3)
        }
    finally:
        reader.close()


def said(text: str) -> list[str]:
    """The replay's own lines, `P@O: state...` (log lines of the consumer left out)."""
    return [line for line in text.splitlines() if re.match(r"\d+@\d+: ", line)]


def answered(
    capsys: pytest.CaptureFixture[str],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What a `dlq ... --json` command printed: each record's result, and the totals."""
    *records, totals = map(msgspec.json.decode, capsys.readouterr().out.splitlines())
    return records, totals


def listed(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """`dlq list --json`: one object per record."""
    capsys.readouterr()
    assert main(["dlq", "list", "--json"]) == 0
    return [msgspec.json.decode(line) for line in capsys.readouterr().out.splitlines()]


def logged(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    found = [msgspec.json.decode(line) for line in stream.getvalue().splitlines()]
    return [line for line in found if line["event"] == event]


def cli_env(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, dsn: str, **overrides: str
) -> None:
    """The tool's variables: `settings`' topics and group, `dsn` (the operator's login)."""
    values = {
        "DATABASE_DSN": dsn,
        "KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOPIC": settings.topic,
        "DLQ_TOPIC": settings.dlq_topic,
        "GROUP_ID": settings.group_id,
        "DELIVERY_TIMEOUT": "20s",
        **overrides,
    }
    for name, value in values.items():
        monkeypatch.setenv(f"REWARDS_MEMBERSHIP_{name}", value)
    monkeypatch.setenv("COLUMNS", "400")


@pytest.mark.parametrize(
    ("dlq_limit", "padding"),
    [
        # refused by produce(): larger than the DLQ producer's message.max.bytes (1 MiB)
        (IDENTITY_MEMBERSHIP_DLQ.max_message_bytes, 1_200_000),
        # refused by the broker: within the client's limit, above the DLQ topic's
        (100_000, 300_000),
    ],
    ids=["client-refuses", "broker-refuses"],
)
def test_dead_letter_too_large_for_the_dlq_becomes_a_reference_record(  # noqa: PLR0915
    *,
    kit: ConsumerKit,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    dlq_limit: int,
    padding: int,
    operator_dsn: str,
    json_logs: io.StringIO,
) -> None:
    topic = kit.kafka_topic(partitions=3, config={"max.message.bytes": str(SOURCE_LIMIT)})
    dlq = kit.kafka_topic(partitions=3, config={"max.message.bytes": str(dlq_limit)})
    producer = big_producer(kit.kafka_bootstrap)
    partition, key, value, headers = poison(
        kit.raw, kit.event, 0, padding, CorrelationId="onboarding-79"
    )
    traceparent = ("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode())
    bad = (partition, key, value, [*headers, traceparent])
    records = [
        valid(kit.event, 0),
        bad,
        valid(kit.event, 0),
        valid(kit.event, 1),
        valid(kit.event, 2),
    ]
    consumer = kit.start_consumer(topic=topic, dlq_topic=dlq)
    produce(producer, topic, records)
    consumer.wait_handled(len(records), timeout=90)

    # Every partition moved on, the poison's included; the valid records are applied.
    assert consumer.total("rewards_membership_applied_total") == 4
    kit.wait(
        lambda: committed(kit.kafka_bootstrap, kit.settings.group_id, topic) == {0: 3, 1: 1, 2: 1},
        what="offsets of every partition committed",
    )
    assert consumer.consumer.paused_partitions == frozenset()
    # The replacement's warning names the event as its other lines do: the spec's fields,
    # its CorrelationId and its trace.
    [warning] = logged(json_logs, "dead-letter-value-replaced")
    [dead] = logged(json_logs, "dead-lettered")
    assert (warning["offset"], warning["size"]) == (1, len(bad[2]))
    for name in ("MessageId", "AgentUserId", "CompanyId", "Status", "Reason", "Version"):
        assert warning[name] == dead[name], name
    assert (warning["CorrelationId"], warning["trace_id"]) == ("onboarding-79", TRACE_ID)
    assert (dead["CorrelationId"], dead["trace_id"]) == ("onboarding-79", TRACE_ID)
    replaced = consumer.value("rewards_identity_membership_dlq_replaced_total", reason="too-large")
    assert replaced == 1, consumer.metrics.registry.get_sample_value(
        "rewards_identity_membership_dlq_total", {"code": "REWARDS_MEMBERSHIP_EVENT_INVALID"}
    )

    [letter] = dead_letters(kit.kafka_bootstrap, dlq)
    assert letter.key == bad[1]
    assert letter.replaced == "too-large"
    assert (DLT_VALUE_REPLACED_HEADER, b"too-large") in letter.headers
    reference = decode_reference(letter.value)
    assert isinstance(reference, DeadLetterReference)
    assert (reference.original_topic, reference.original_partition) == (topic, 0)
    assert reference.original_offset == 1
    assert reference.size == len(bad[2])
    assert reference.sha256 == sha256_hex(bad[2])
    assert "MSG_SIZE_TOO_LARGE" in reference.error
    assert letter.info is not None
    assert letter.info.error_path == "$.Payload.CompanyId"
    assert len(letter.value or b"") < 2000
    assert kit.sql("SELECT outcome FROM rewards.inbox WHERE outcome = 'dead-lettered'") == [
        ("dead-lettered",)
    ]
    kit.wait(
        lambda: consumer.value("rewards_identity_membership_dlq_unreplayed") == 1,
        what="the unreplayed gauge counts it",
    )

    local = msgspec.structs.replace(kit.settings, topic=topic, dlq_topic=dlq)
    cli_env(monkeypatch, local, operator_dsn)
    [row] = listed(capsys)
    assert row["value"].startswith("reference (too-large")
    assert row["state"] == "pending"

    # Still invalid on the same bytes: refused with its reason, exit 1.
    capsys.readouterr()
    assert main(["dlq", "replay", "--offset", "0", "--partition", "0", "--json"]) == 1
    [refused], _ = answered(capsys)
    assert refused["result"] == "refused"
    assert "still invalid: $.Payload.CompanyId" in refused["detail"]

    # --force: the original bytes are read back from the source topic and republished; the
    # consumer processes the copy (not a duplicate) and dead-letters it again, as a reference.
    assert main(["dlq", "replay", "--offset", "0", "--partition", "0", "--force", "--json"]) == 0
    [out], _ = answered(capsys)
    assert (out["partition"], out["offset"], out["result"]) == (0, 0, "replayed")
    assert out["target_topic"] == topic
    target_partition, target_offset = out["target_partition"], out["target_offset"]
    kit.wait(
        lambda: len(dead_letters(kit.kafka_bootstrap, dlq)) == 2, what="the copy dead-lettered"
    )
    source = create_consumer(kit.kafka_bootstrap, group_id="source-reader", client_id="src")
    try:
        copy = read_at(source, topic, target_partition, target_offset, timeout=10)
    finally:
        source.close()
    assert copy is not None
    assert (copy.key(), copy.value()) == (bad[1], bad[2])
    before = high_watermarks(kit.kafka_bootstrap, topic)

    # Replaying the same DLQ record again produces nothing.
    assert main(["dlq", "replay", "--offset", "0", "--partition", "0", "--force", "--json"]) == 0
    [again], totals = answered(capsys)
    assert again["result"] == "already-replayed"
    assert totals["results"]["replayed"] == 0
    assert high_watermarks(kit.kafka_bootstrap, topic) == before
    rows = listed(capsys)
    assert len(rows) == 2
    assert sum(r["state"] == "pending" for r in rows) == 1

    # Resolving closes the reference record's mark (keyed by the original's MessageId, read
    # back from the source topic): nothing is left for the unreplayed gauge.
    assert main(["dlq", "resolve", "--all", "--reason", "a test record", "--json"]) == 0
    resolved, _ = answered(capsys)
    assert sorted(r["result"] for r in resolved) == ["already-replayed", "resolved"]
    kit.wait(
        lambda: consumer.value("rewards_identity_membership_dlq_unreplayed") == 0,
        what="no dead letter left open",
    )


def test_replay_says_clearly_when_the_original_is_gone(
    *,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    start_consumer: Any,
    event: Event,
    raw: Callable[..., bytes],
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    operator_dsn: str,
) -> None:
    topic = kafka_topic(partitions=3, config={"max.message.bytes": str(SOURCE_LIMIT)})
    dlq = kafka_topic(partitions=3, config=IDENTITY_MEMBERSHIP_DLQ.config())
    consumer = start_consumer(topic=topic, dlq_topic=dlq)
    produce(big_producer(kafka_bootstrap), topic, [poison(raw, event, 1, 1_200_000)])
    consumer.wait_handled(1, timeout=90)
    consumer.close()
    # Retention removed it (deleting the records below offset 1 does what retention does).
    admin: AdminClient = create_admin(kafka_bootstrap, client_id="rm-test")
    for future in admin.delete_records([TopicPartition(topic, 1, 1)]).values():
        future.result(timeout=30)
    cli_env(
        monkeypatch, msgspec.structs.replace(settings, topic=topic, dlq_topic=dlq), operator_dsn
    )
    capsys.readouterr()
    assert main(["dlq", "replay", "--offset", "0", "--force"]) == 1
    err = said(capsys.readouterr().err)
    assert err == [
        f"1@0: gone: the original {topic}[1]@0 is no longer retained by the source topic"
    ]


def test_dead_letter_that_cannot_be_written_pauses_only_its_partition(
    *,
    kit: ConsumerKit,
) -> None:
    topic = kit.kafka_topic(partitions=3)
    # The DLQ topic does not exist yet (the broker does not create topics): every dead
    # letter write fails for a retriable reason until an operator creates it.
    dlq = f"pin-test.dlq-missing.{uuid.uuid4().hex[:8]}"
    producer = big_producer(kit.kafka_bootstrap)
    consumer = kit.start_consumer(topic=topic, dlq_topic=dlq, delivery_timeout=timedelta(seconds=2))
    first = [valid(kit.event, 0), poison(kit.raw, kit.event, 0, 100), valid(kit.event, 0)]
    others = [valid(kit.event, 1), valid(kit.event, 2), valid(kit.event, 1)]
    produce(producer, topic, first + others)

    kit.wait(
        lambda: (
            consumer.consumer.paused_partitions == frozenset({0})
            and consumer.total("rewards_membership_applied_total") == 3
        ),
        what="partition 0 paused, partitions 1 and 2 applied",
    )
    # Partition 0 is committed at its failed batch's first record, with a note of the pause
    # (the offset's metadata); the others past their records.
    kit.wait(
        lambda: committed(kit.kafka_bootstrap, kit.settings.group_id, topic) == {0: 0, 1: 2, 2: 1},
        what="the other partitions committed, partition 0 noted at its first record",
    )
    assert consumer.consumer.kafka_state().status == "degraded"
    assert consumer.value("rewards_membership_retries_total", dependency="kafka") >= 1
    settings = msgspec.structs.replace(kit.settings, topic=topic, dlq_topic=dlq)
    with psycopg.connect(settings.database_dsn.reveal()) as conn:
        shown = consumer_status(settings, conn)
    assert shown.paused is not None
    [paused] = shown.paused
    assert (paused.partition, paused.dependency, paused.host) == (0, "kafka", socket.gethostname())
    assert dlq in paused.reason or "UNKNOWN_TOPIC" in paused.reason.upper()
    assert paused.attempts >= 1
    assert 0 <= paused.paused_seconds < 120

    # Records keep arriving on the paused partition: its lag gauge grows, its pause ages.
    produce(producer, topic, [valid(kit.event, 0, 1) for _ in range(5)])
    kit.wait(
        lambda: consumer.value("rewards_identity_membership_consumer_lag", partition="0") == 8,
        what="lag of the paused partition counts every record since its committed offset",
    )
    # Between two pauses the partition retries its batch (unpaused for the DLQ's delivery
    # timeout), so the paused count is awaited with the gauge, not read once.
    kit.wait(
        lambda: (
            consumer.value("rewards_membership_partition_paused_seconds", partition="0") > 0.5
            and consumer.value("rewards_membership_paused_partitions") == 1
        ),
        what="the paused-seconds gauge moves, one partition paused",
    )
    assert consumer.value("rewards_identity_membership_consumer_lag", partition="1") == 0

    ensure_topics(create_admin(kit.kafka_bootstrap, client_id="rm-test"), [(dlq, 3)])
    consumer.wait_handled(3 + 3 + 5, timeout=90)
    kit.wait(lambda: consumer.consumer.paused_partitions == frozenset(), what="partition 0 resumed")
    kit.wait(lambda: consumer.consumer.kafka_state().status == "ok", what="ready again")
    kit.wait(
        lambda: consumer.value("rewards_identity_membership_consumer_lag", partition="0") == 0,
        what="lag back to 0",
    )
    assert consumer.value("rewards_membership_partition_paused_seconds", partition="0") == 0
    # The partition's next commit cleared its note: nothing paused on the brokers either.
    with psycopg.connect(settings.database_dsn.reveal()) as conn:
        assert consumer_status(settings, conn).paused == []
    assert len(dead_letters(kit.kafka_bootstrap, dlq)) == 1
    assert consumer.total("rewards_identity_membership_dlq_total") == 1
    (applied,) = kit.sql("SELECT count(*) FROM rewards.agent_performance")[0]
    assert applied == 2 + 3 + 5


def test_dead_letters_acknowledged_before_a_failure_are_not_written_again(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    raw: Callable[..., bytes],
    sql: Sql,
    database: str,
    settings: Settings,
    wait: Callable[..., None],
) -> None:
    consumer = start_consumer(db_lock_timeout=timedelta(milliseconds=500))
    # Another session blocks inserts into the inbox (reads stay possible): the batch is
    # decided, its dead letters are acknowledged, then marking them fails on the lock
    # timeout; the batch is retried until the lock goes.
    with psycopg.connect(database) as blocker:
        blocker.execute("LOCK TABLE rewards.inbox IN SHARE MODE")
        producer = big_producer(kafka.bootstrap)
        # The last one has no readable MessageId: it is keyed by its position.
        garbage = (1, b"k", b"\x00\xffnot json", None)
        produce(
            producer, kafka.topic, [*(poison(raw, event, p, 100) for p in (0, 1, 2, 2)), garbage]
        )
        wait(
            lambda: (
                consumer.value("rewards_membership_retries_total", dependency="postgresql") >= 3
            ),
            what="the batch retried several times",
        )
        # A lock, not an outage: the partitions wait for it, the database stays ready.
        wait(
            lambda: (
                consumer.value(
                    "rewards_membership_paused_partitions_by_reason", reason="lock_timeout"
                )
                >= 1
            ),
            what="partitions paused for the lock",
        )
        assert consumer.consumer.database_state().status == "ok"
        assert len(dead_letters(kafka.bootstrap, kafka.dlq_topic)) == 5
        blocker.rollback()
    consumer.wait_handled(5)
    wait(lambda: consumer.consumer.paused_partitions == frozenset(), what="resumed")
    letters = dead_letters(kafka.bootstrap, kafka.dlq_topic)
    assert sorted(
        (r.info.original_partition, r.info.original_offset) for r in letters if r.info
    ) == [
        (0, 0),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    assert consumer.total("rewards_identity_membership_dlq_total") == 5
    marks = sql("SELECT idempotency_key FROM rewards.inbox WHERE outcome = 'dead-lettered'")
    assert len(marks) == 5
    assert (f"rewards:identity-membership:at:{kafka.topic}:1:1",) in marks

    # A redelivery (a new consumer group reading from offset 0) is a duplicate now.
    again = start_consumer(group_id=settings.group_id + "-again")
    again.wait_handled(5)
    assert again.total("rewards_membership_skipped_duplicate_total") == 5
    assert len(dead_letters(kafka.bootstrap, kafka.dlq_topic)) == 5


def test_a_row_locked_elsewhere_pauses_its_partition_within_the_lock_timeout_and_recovers(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    locked_row: Callable[[uuid.UUID, uuid.UUID], psycopg.Connection[Any]],
    states: Sql,
    wait: Callable[..., None],
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    blocker = locked_row(agent, company)
    consumer = start_consumer(db_lock_timeout=timedelta(milliseconds=300))
    kafka.send(event(agent, company, 2, "Left", reason="SelfLeave"))
    paused = "rewards_membership_paused_partitions_by_reason"
    wait(
        lambda: consumer.value(paused, reason="lock_timeout") == 1,
        what="the blocked statement failed within the lock timeout, its partition paused",
    )
    # A lock, not an outage: the database stays ready.
    assert consumer.consumer.database_state().status == "ok"
    assert consumer.handled == 0
    blocker.rollback()
    consumer.wait_handled(1)
    wait(lambda: consumer.value(paused, reason="lock_timeout") == 0, what="resumed")
    assert states() == [("Left", 2, 2)]


def dead_lettered(kafka: Any, event: Event, sql: Sql, *, source: str, group: str) -> str:
    """A valid record of `source` (partition 0, offset 0) an earlier release dead-lettered:
    its copy at offset 0 of the DLQ and its dead-letter mark in the inbox; its inbox key."""
    envelope = envelope_for(event(uuid.uuid4(), uuid.uuid4(), 1))
    info = DeadLetterInfo(
        error_code="REWARDS_MEMBERSHIP_EVENT_INVALID",
        exception_message="$.Payload.Reason: missing",
        exception_fqcn="pin_contracts.errors.ContractViolation",
        original_topic=source,
        original_partition=0,
        original_offset=0,
        original_timestamp_ms=1_700_000_000_000,
        original_consumer_group=group,
    )
    produce(
        kafka.producer,
        kafka.dlq_topic,
        [(0, kafka_key(envelope), encode(envelope), headers_for(envelope) + info.to_headers())],
    )
    key = f"rewards:identity-membership:{envelope.message_id}"
    sql("INSERT INTO rewards.inbox (idempotency_key, outcome) VALUES (%s, 'dead-lettered')", [key])
    return key


def test_a_replayed_dead_letter_is_processed_again_not_skipped_as_a_duplicate(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    sql: Sql,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    operator_dsn: str,
) -> None:
    # A record an earlier release refused (now valid), dead-lettered and marked in the inbox.
    key = dead_lettered(kafka, event, sql, source=kafka.topic, group=settings.group_id)
    consumer = start_consumer()
    cli_env(monkeypatch, settings, operator_dsn)
    capsys.readouterr()
    assert main(["dlq", "replay", "--all", "--json"]) == 0
    [replayed], _ = answered(capsys)
    assert (replayed["partition"], replayed["offset"]) == (0, 0)
    assert (replayed["result"], replayed["target_topic"]) == ("replayed", kafka.topic)
    consumer.wait_handled(1)
    assert consumer.value("rewards_membership_applied_total", status="Active") == 1
    assert sql("SELECT outcome FROM rewards.inbox WHERE idempotency_key = %s", [key]) == [
        ("membership-applied",)
    ]
    [(forced, target)] = sql("SELECT forced, target_topic FROM rewards.dlq_replays")
    assert (forced, target) == (False, kafka.topic)
    # Twice: nothing more is produced.
    assert main(["dlq", "replay", "--all", "--json"]) == 0
    assert [r["result"] for r in answered(capsys)[0]] == ["already-replayed"]
    assert sum(high_watermarks(kafka.bootstrap, kafka.topic).values()) == 1


def test_a_replay_the_broker_refuses_leaves_the_dead_letter_pending_and_counted(
    *,
    kafka: Any,
    kafka_topic: Callable[..., str],
    event: Event,
    sql: Sql,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    operator_dsn: str,
) -> None:
    # The record's source topic now refuses it (its limit was lowered below the record).
    source = kafka_topic(partitions=3, config={"max.message.bytes": "100"})
    key = dead_lettered(kafka, event, sql, source=source, group=settings.group_id)
    cli_env(monkeypatch, settings, operator_dsn)
    capsys.readouterr()

    assert main(["dlq", "replay", "--all", "--json"]) == 1

    [failed], totals = answered(capsys)
    assert (failed["partition"], failed["offset"], failed["result"]) == (0, 0, "failed")
    assert (totals["results"]["failed"], totals["results"]["replayed"]) == (1, 0)
    # Still a dead letter: its mark is back, so the unreplayed gauge (and the DLQ alert)
    # keep counting it, and no replay was recorded.
    assert sql("SELECT outcome FROM rewards.inbox WHERE idempotency_key = %s", [key]) == [
        ("dead-lettered",)
    ]
    assert sql("SELECT count(*) FROM rewards.dlq_replays") == [(0,)]
    assert [r["state"] for r in listed(capsys)] == ["pending"]


def test_a_dead_letter_write_failing_midway_is_completed_without_second_copies(
    *,
    kafka: Any,
    raw: Callable[..., bytes],
    event: Event,
) -> None:
    # A producer queue of two records: the third produce() of a write is refused with a
    # retriable error (queue full), so each write gets only part of the batch through.
    producer = create_producer(
        kafka.bootstrap,
        client_id="rm-midway",
        extra={"queue.buffering.max.messages": 2, "message.timeout.ms": 10_000},
    )
    writer = DeadLetterer(producer, topic=kafka.dlq_topic, group_id="g", delivery_timeout=10.0)
    produce(kafka.producer, kafka.topic, [poison(raw, event, p % 3, 100) for p in range(5)])
    source = create_consumer(kafka.bootstrap, group_id="midway", client_id="midway")
    try:
        source.assign([TopicPartition(kafka.topic, p, 0) for p in range(3)])
        messages: list[Any] = []
        while len(messages) < 5:
            messages += [m for m in source.consume(5, timeout=10) if m.error() is None]
    finally:
        source.close()
    batch_of_invalid = [Record(m, validate(m.value())) for m in messages]
    assert all(isinstance(record.item, InvalidEvent) for record in batch_of_invalid)

    first = writer.write(batch_of_invalid)
    assert len(first.acknowledged) == 2
    assert first.failed  # the rest of the batch's partitions retry later
    assert all(f.retriable and f.code == "_QUEUE_FULL" for f in first.failed.values())
    second = writer.write(batch_of_invalid)
    assert first.acknowledged.items() <= second.acknowledged.items()
    assert len(second.acknowledged) == 4
    third = writer.write(batch_of_invalid)
    assert len(third.acknowledged) == 5
    assert third.failed == {}
    assert writer.write(batch_of_invalid).acknowledged == third.acknowledged

    letters = dead_letters(kafka.bootstrap, kafka.dlq_topic)
    originals = sorted(
        (r.info.original_partition, r.info.original_offset) for r in letters if r.info
    )
    assert originals == sorted((m.partition(), m.offset()) for m in messages)
