"""Hostile records through the real consumer on real Kafka and PostgreSQL: no bytes stop it,
and record keys are part of the contract.

Each class of hostile value (nested 100,000 deep, as large as the topic admits, invalid
UTF-8, duplicate keys, numbers beyond int64 and float) between two valid records on one
partition: dead-lettered once with its reason (the spec's headers), the valid record after
it applied, the partition's offset past all three, the consumer still running; `dlq list`
and `dlq replay` read the dead letter back. A valid record whose key is missing, not UTF-8
or not its AgentUserId is applied, counted and logged once. A record whose header names are
not UTF-8 (which confluent-kafka cannot read: `Message.headers()` raises) is taken by its
value while every partition goes on, and a dead letter like it is listed and replayed.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec
import pytest
from confluent_kafka import Producer, TopicPartition
from consumer_kit import ConsumerKit, record_of

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    DLT_EXCEPTION_FQCN_HEADER,
    DLT_EXCEPTION_MESSAGE_HEADER,
    DLT_ORIGINAL_CONSUMER_GROUP_HEADER,
    DLT_ORIGINAL_OFFSET_HEADER,
    DLT_ORIGINAL_PARTITION_HEADER,
    DLT_ORIGINAL_TOPIC_HEADER,
    ERROR_CODE_HEADER,
    ERROR_PATH_HEADER,
    IDENTITY_MEMBERSHIP_DLQ,
    REWARDS_MEMBERSHIP_EVENT_INVALID,
    DeadLetterInfo,
    envelope_for,
    header_text,
    headers_for,
)
from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.kafka import create_consumer, create_producer
from pin_testkit import fixtures
from pin_testkit.kafka_wire import WireHeaders, WireRecord, produce_wire
from pin_testkit.records import read_topic
from rewards_membership.cli import main
from rewards_membership.dlq.topic import DeadLetterRecord, read_dead_letters
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

json_logs = fixtures.json_logs("rewards_membership", "rewards-membership")

DEPTH: Final = 100_000
MAX_BYTES: Final = AGENT_MEMBERSHIP_CHANGED.max_message_bytes
MAX_RECORD_OVERHEAD: Final = 256
"""Bytes of a one-record batch besides its value (batch and record headers, the key): the
value of the largest record the topic takes is `max.message.bytes` less these."""

Record = tuple[bytes | None, bytes | None, Any]


def envelope(kit: ConsumerKit, agent: uuid.UUID) -> dict[str, Any]:
    """A valid event of `agent` as a JSON document, to be bent."""
    document: dict[str, Any] = msgspec.json.decode(
        record_of(envelope_for(kit.event(agent, uuid.uuid4(), 1)))[1] or b""
    )
    return document


def hostile(kit: ConsumerKit, kind: str) -> tuple[bytes, str]:  # noqa: PLR0911 - one per class
    """A record value of the class `kind`, and the reason its dead letter must give."""
    agent = uuid.uuid4()
    document = envelope(kit, agent)
    head = msgspec.json.encode(document)[:-1]  # the envelope without its closing brace
    if kind == "arrays-100000-deep":
        return b"[" * DEPTH + b"]" * DEPTH, "$: Expected `object`, got `array`"
    if kind == "objects-100000-deep":
        deep = b'{"a":' * DEPTH + b"1" + b"}" * DEPTH
        return head + b',"Extension":' + deep + b"}", "$: JSON nested too deeply"
    if kind == "max-size":
        # An envelope whose Payload lacks CompanyId, grown to the largest record the topic
        # takes by an unknown field.
        del document["Payload"]["CompanyId"]
        head = msgspec.json.encode(document)[:-1]
        filler = MAX_BYTES - MAX_RECORD_OVERHEAD - len(head) - len(b',"Filler":""}')
        value = head + b',"Filler":"' + b"x" * filler + b'"}'
        return value, "$.Payload.CompanyId: Object missing required field `CompanyId`"
    if kind == "invalid-utf8":
        document["Payload"]["Status"] = "STATUS"
        value = msgspec.json.encode(document).replace(b'"STATUS"', b'"Act\xff\xfeive"')
        return value, "$: not valid UTF-8 JSON: Invalid UTF-8 encoded string"
    if kind == "duplicate-keys":
        # The first Payload is valid, the last (the one that counts) has no AgentUserId.
        second = dict(document["Payload"])
        del second["AgentUserId"]
        value = head + b',"Payload":' + msgspec.json.encode(second) + b"}"
        return value, "$.Payload.AgentUserId: Object missing required field `AgentUserId`"
    if kind == "int-beyond-int64":
        document["Payload"]["Version"] = "VERSION"
        value = msgspec.json.encode(document).replace(b'"VERSION"', b"9" * 400)
        return value, "$.Payload.Version: Expected `int` <= 9223372036854775807"
    assert kind == "number-beyond-float"
    document["Payload"]["Version"] = "VERSION"
    value = msgspec.json.encode(document).replace(b'"VERSION"', b"1e400")
    return value, "$.Payload.Version: Number out of range"


def produce(producer: Producer, topic: str, partition: int, *records: Record) -> None:
    tracker = DeliveryTracker[int]()
    for key, value, headers in records:
        producer.produce(
            topic,
            partition=partition,
            key=key,
            value=value,
            headers=headers or [],
            on_delivery=tracker,
        )
    flush_or_raise(producer, 30.0, tracker)


def dead_letters(bootstrap: str, topic: str) -> list[DeadLetterRecord]:
    reader = create_consumer(bootstrap, group_id="dlq-reader", client_id="hostile-dlq-reader")
    try:
        return list(read_dead_letters(reader, topic, timeout=10))
    finally:
        reader.close()


def committed(bootstrap: str, group: str, topic: str, partition: int) -> int:
    reader = create_consumer(bootstrap, group_id=group, client_id="hostile-committed")
    try:
        [tp] = reader.committed([TopicPartition(topic, partition)], timeout=10)
        return int(tp.offset)
    finally:
        reader.close()


def cli_env(monkeypatch: pytest.MonkeyPatch, settings: Settings, dsn: str) -> None:
    values = {
        "DATABASE_DSN": dsn,
        "KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOPIC": settings.topic,
        "DLQ_TOPIC": settings.dlq_topic,
        "GROUP_ID": settings.group_id,
        "DELIVERY_TIMEOUT": "20s",
    }
    for name, value in values.items():
        monkeypatch.setenv(f"REWARDS_MEMBERSHIP_{name}", value)
    monkeypatch.setenv("COLUMNS", "400")


def logged(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    found = [msgspec.json.decode(line) for line in stream.getvalue().splitlines()]
    return [line for line in found if line["event"] == event]


@pytest.mark.parametrize(
    "kind",
    [
        "arrays-100000-deep",
        "objects-100000-deep",
        "max-size",
        "invalid-utf8",
        "duplicate-keys",
        "int-beyond-int64",
        "number-beyond-float",
    ],
)
def test_a_hostile_record_is_dead_lettered_once_and_its_partition_goes_on(
    *,
    kit: ConsumerKit,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    operator_dsn: str,
    json_logs: io.StringIO,
) -> None:
    # The topics as the catalogue configures them (max.message.bytes included).
    topic = kit.kafka_topic(partitions=3, config=AGENT_MEMBERSHIP_CHANGED.config())
    dlq = kit.kafka_topic(partitions=3, config=IDENTITY_MEMBERSHIP_DLQ.config())
    producer = create_producer(
        kit.kafka_bootstrap,
        client_id="rm-hostile-tests",
        linger_ms=1,
        extra={"message.max.bytes": 2 * MAX_BYTES},
    )
    before, after = (
        envelope_for(kit.event(uuid.uuid4(), uuid.uuid4(), 1)),
        envelope_for(kit.event(uuid.uuid4(), uuid.uuid4(), 1)),
    )
    value, reason = hostile(kit, kind)
    key = str(uuid.uuid4()).encode()
    bad_headers = headers_for(before)  # any valid-looking headers: the record's own
    consumer = kit.start_consumer(topic=topic, dlq_topic=dlq)
    produce(producer, topic, 0, record_of(before), (key, value, bad_headers), record_of(after))
    consumer.wait_handled(3, timeout=90)

    # The valid records on either side are applied; the hostile one is dead-lettered once.
    assert consumer.total("rewards_membership_applied_total") == 2
    assert (
        consumer.value(
            "rewards_identity_membership_dlq_total", code=REWARDS_MEMBERSHIP_EVENT_INVALID
        )
        == 1
    )
    applied = {r[0] for r in kit.sql("SELECT agent_user_id FROM rewards.agent_performance")}
    assert applied == {before.payload.agent_user_id, after.payload.agent_user_id}
    kit.wait(
        lambda: committed(kit.kafka_bootstrap, kit.settings.group_id, topic, 0) == 3,
        what="the partition's offset past all three records",
    )
    assert consumer.error is None
    assert consumer.consumer.paused_partitions == frozenset()
    [line] = logged(json_logs, "dead-lettered")
    assert line["reason"].startswith(reason), line["reason"]
    assert (line["partition"], line["offset"], line["key"]) == (0, 1, key.decode())

    [letter] = dead_letters(kit.kafka_bootstrap, dlq)
    assert letter.key == key
    assert letter.info is not None
    assert letter.info.exception_message.startswith(reason)
    headers = dict(letter.headers)
    assert headers[ERROR_CODE_HEADER] == REWARDS_MEMBERSHIP_EVENT_INVALID.encode()
    assert (header_text(letter.headers, DLT_EXCEPTION_MESSAGE_HEADER) or "").startswith(reason)
    assert headers[DLT_EXCEPTION_FQCN_HEADER] == b"pin_contracts.errors.ContractViolation"
    assert headers[ERROR_PATH_HEADER] == reason.partition(":")[0].encode()
    assert headers[DLT_ORIGINAL_TOPIC_HEADER] == topic.encode()
    assert headers[DLT_ORIGINAL_PARTITION_HEADER] == b"\x00\x00\x00\x00"
    assert headers[DLT_ORIGINAL_OFFSET_HEADER] == (1).to_bytes(8, "big")
    if letter.replaced is None:
        assert letter.value == value  # byte for byte
    else:
        assert kind == "max-size"  # too large for the DLQ with its headers: a reference
        assert letter.replaced == "too-large"
    consumer.close()

    # The tools read it back: listed with its reason, refused by a replay as still invalid.
    cli_env(
        monkeypatch,
        msgspec.structs.replace(kit.settings, topic=topic, dlq_topic=dlq),
        operator_dsn,
    )
    capsys.readouterr()
    assert main(["dlq", "list", "--json"]) == 0
    [row] = [msgspec.json.decode(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["state"], row["code"], row["key"]) == (
        "pending",
        REWARDS_MEMBERSHIP_EVENT_INVALID,
        key.decode(),
    )
    assert row["reason"].startswith(reason)
    assert main(["dlq", "replay", "--offset", "0", "--partition", "0", "--json"]) == 1
    [refused, totals] = map(msgspec.json.decode, capsys.readouterr().out.splitlines())
    assert refused["result"] == "refused"
    assert refused["detail"].startswith(f"still invalid: {reason}"), refused["detail"]
    assert totals["results"]["refused"] == 1


KEY_CASES: Final[dict[str, Callable[[uuid.UUID], bytes | None]]] = {
    "missing": lambda agent: None,
    "not_utf8": lambda agent: b"\xff\xfe" + str(agent).encode()[2:],
    "not_agent_user_id": lambda agent: str(agent).upper().encode(),
}


@pytest.mark.parametrize("reason", list(KEY_CASES))
def test_a_record_keyed_other_than_by_its_agent_is_applied_counted_and_logged_once(
    *, kit: ConsumerKit, reason: str, json_logs: io.StringIO
) -> None:
    topic = kit.kafka_topic(partitions=3, config=AGENT_MEMBERSHIP_CHANGED.config())
    producer = create_producer(kit.kafka_bootstrap, client_id="rm-key-tests", linger_ms=1)
    agent = uuid.UUID(f"abcdef00-0000-4000-8000-{uuid.uuid4().hex[:12]}")  # letters: case shows
    company = uuid.uuid4()
    wrong = envelope_for(kit.event(agent, company, 1))
    right = envelope_for(kit.event(agent, company, 2))
    _, value, headers = record_of(wrong)
    consumer = kit.start_consumer(topic=topic)
    produce(producer, topic, 0, (KEY_CASES[reason](agent), value, headers), record_of(right))
    # A redelivery of the wrongly keyed record: a duplicate, not counted again.
    produce(producer, topic, 0, (KEY_CASES[reason](agent), value, headers))
    consumer.wait_handled(3)

    assert consumer.value("rewards_membership_applied_total", status="Active") == 2
    assert consumer.total("rewards_membership_skipped_duplicate_total") == 1
    assert kit.sql(
        "SELECT last_membership_version FROM rewards.agent_performance"
        " WHERE agent_user_id = %(agent)s AND company_id = %(company)s",
        {"agent": agent, "company": company},
    ) == [(2,)]
    counts = {
        r: consumer.value("rewards_membership_key_mismatch_total", reason=r) for r in KEY_CASES
    }
    assert counts == {r: float(r == reason) for r in KEY_CASES}
    # Every reason is exported from the start, at 0.
    for r in KEY_CASES:
        assert (
            consumer.metrics.registry.get_sample_value(
                "rewards_membership_key_mismatch_total", {"reason": r}
            )
            is not None
        )
    [line] = logged(json_logs, "membership-key-mismatch")
    assert line["level"] == "WARNING"
    assert (line["keyReason"], line["MessageId"]) == (reason, str(wrong.message_id))
    assert line["AgentUserId"] == str(agent)
    key = KEY_CASES[reason](agent)
    assert line["key"] == (None if key is None else key.decode(errors="replace"))
    assert consumer.total("rewards_contract_mismatch_total") == 0
    consumer.close()


UNREADABLE_NAME: Final = b"\xff\xfe"
"""A header name that is not UTF-8: confluent-kafka's `Message.headers()` raises on it."""


def unreadable(headers: list[Any] | None) -> WireHeaders:
    """`headers` as the wire writes them, a header whose name is not UTF-8 among them."""
    named: list[tuple[bytes, bytes | None]] = [
        (name.encode(), value.encode() if isinstance(value, str) else value)
        for name, value in headers or []
    ]
    return [*named[:1], (UNREADABLE_NAME, b"value"), *named[1:]]


def test_a_record_whose_header_names_are_not_utf8_is_taken_by_its_value_on_every_partition(
    *, kit: ConsumerKit, json_logs: io.StringIO
) -> None:
    # Headers are no part of the contract (the value is authoritative): such a record is
    # applied when its value is valid and dead-lettered when it is not, its headers left
    # behind; its partition and the others go on, nothing crashes.
    topic = kit.kafka_topic(partitions=3, config=AGENT_MEMBERSHIP_CHANGED.config())
    dlq = kit.kafka_topic(partitions=3, config=IDENTITY_MEMBERSHIP_DLQ.config())
    producer = create_producer(kit.kafka_bootstrap, client_id="rm-header-tests", linger_ms=1)
    good = {
        p: [envelope_for(kit.event(uuid.uuid4(), uuid.uuid4(), 1)) for _ in range(2)]
        for p in range(3)
    }
    valid = envelope_for(kit.event(uuid.uuid4(), uuid.uuid4(), 1))
    valid_key, valid_value, valid_headers = record_of(valid)
    invalid_key = str(uuid.uuid4()).encode()
    invalid_document = envelope(kit, uuid.UUID(invalid_key.decode()))
    del invalid_document["Payload"]["CompanyId"]
    invalid_value = msgspec.json.encode(invalid_document)
    bad: list[WireRecord] = [
        (valid_key, valid_value, unreadable(valid_headers)),
        (invalid_key, invalid_value, unreadable(headers_for(valid))),
    ]
    consumer = kit.start_consumer(topic=topic, dlq_topic=dlq)
    for partition in range(3):
        produce(producer, topic, partition, record_of(good[partition][0]))
    assert produce_wire(kit.kafka_bootstrap, topic, 0, bad) == [1, 2]
    for partition in range(3):
        produce(producer, topic, partition, record_of(good[partition][1]))
    consumer.wait_handled(8, timeout=90)

    assert consumer.error is None
    assert consumer.total("rewards_membership_applied_total") == 7
    assert (
        consumer.value(
            "rewards_identity_membership_dlq_total", code=REWARDS_MEMBERSHIP_EVENT_INVALID
        )
        == 1
    )
    applied = {r[0] for r in kit.sql("SELECT agent_user_id FROM rewards.agent_performance")}
    expected = {e.payload.agent_user_id for es in good.values() for e in es}
    assert applied == expected | {valid.payload.agent_user_id}
    ends = {0: 4, 1: 2, 2: 2}
    kit.wait(
        lambda: (
            {p: committed(kit.kafka_bootstrap, kit.settings.group_id, topic, p) for p in ends}
            == ends
        ),
        what="every partition's offset past its records",
    )
    assert consumer.consumer.paused_partitions == frozenset()

    # Each is said once, with why its headers could not be read.
    warnings = logged(json_logs, "record-headers-unreadable")
    assert [(w["partition"], w["offset"], w["level"]) for w in warnings] == [
        (0, 1, "WARNING"),
        (0, 2, "WARNING"),
    ]
    assert warnings[0]["MessageId"] == str(valid.message_id)
    assert "UnicodeDecodeError" in warnings[0]["headersReason"], warnings[0]
    [dead] = logged(json_logs, "dead-lettered")
    assert (dead["partition"], dead["offset"], dead["key"]) == (0, 2, invalid_key.decode())
    assert dead["reason"].startswith("$.Payload.CompanyId: Object missing required field")

    # The dead letter keeps key and value byte for byte; the headers it could not read are
    # not copied, the DLQ's own are there.
    [letter] = dead_letters(kit.kafka_bootstrap, dlq)
    assert (letter.key, letter.value) == (invalid_key, invalid_value)
    assert letter.info is not None
    assert (letter.info.original_partition, letter.info.original_offset) == (0, 2)
    assert letter.info.error_code == REWARDS_MEMBERSHIP_EVENT_INVALID
    assert letter.original_headers == []
    consumer.close()


def test_a_dead_letter_whose_header_names_are_not_utf8_is_listed_and_replayed(
    *,
    kit: ConsumerKit,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    operator_dsn: str,
) -> None:
    # A dead letter another writer put on the DLQ, its headers unreadable: the DLQ's own
    # headers cannot be read either, so it is listed with why, a replay refuses it unless
    # forced, and a forced replay sends its key and value to the source topic.
    topic = kit.kafka_topic(partitions=3, config=AGENT_MEMBERSHIP_CHANGED.config())
    dlq = kit.kafka_topic(partitions=3, config=IDENTITY_MEMBERSHIP_DLQ.config())
    event = envelope_for(kit.event(uuid.uuid4(), uuid.uuid4(), 1))
    key, value, _ = record_of(event)
    assert key is not None
    info = DeadLetterInfo(
        error_code=REWARDS_MEMBERSHIP_EVENT_INVALID,
        exception_message="$.Payload.CompanyId: must not be Guid.Empty",
        exception_fqcn="pin_contracts.errors.ContractViolation",
        original_topic=topic,
        original_partition=0,
        original_offset=0,
        original_timestamp_ms=0,
        original_consumer_group=kit.settings.group_id,
    )
    headers = unreadable(info.to_headers())
    assert any(name == DLT_ORIGINAL_CONSUMER_GROUP_HEADER.encode() for name, _ in headers)
    assert produce_wire(kit.kafka_bootstrap, dlq, 0, [(key, value, headers)]) == [0]
    cli_env(
        monkeypatch,
        msgspec.structs.replace(kit.settings, topic=topic, dlq_topic=dlq),
        operator_dsn,
    )
    capsys.readouterr()

    assert main(["dlq", "list", "--json"]) == 0
    [row] = [msgspec.json.decode(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["partition"], row["offset"], row["state"], row["code"], row["key"]) == (
        0,
        0,
        "pending",
        None,
        key.decode(),
    )
    assert row["reason"].startswith("headers unreadable: "), row["reason"]

    assert main(["dlq", "replay", "--offset", "0", "--partition", "0", "--json"]) == 1
    [refused, totals] = map(msgspec.json.decode, capsys.readouterr().out.splitlines())
    assert refused["result"] == "refused"
    assert refused["detail"].startswith("no DLQ headers: headers unreadable: "), refused
    assert totals["results"]["refused"] == 1

    args = ["dlq", "replay", "--offset", "0", "--partition", "0", "--force", "--json"]
    assert main(args) == 0
    [replayed, totals] = map(msgspec.json.decode, capsys.readouterr().out.splitlines())
    assert replayed["result"] == "replayed", replayed
    assert totals["results"]["replayed"] == 1
    [copy] = read_topic(kit.kafka_bootstrap, topic)
    assert (copy.key, copy.value, copy.headers) == (key, value, [])
