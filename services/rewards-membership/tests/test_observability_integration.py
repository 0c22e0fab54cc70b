"""What an operator sees of each event (spec "Наблюдаемость"): every log line of it names
MessageId, AgentUserId, CompanyId, Status, Reason, Version, its CorrelationId and its trace,
at INFO (the level services run at), a record the contract refuses included."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException
from consumer_kit import record_of
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pin_contracts import EMPTY_GUID, envelope_for
from pin_runtime.kafka import create_admin, ensure_topics
from pin_testkit import fixtures
from pin_testkit.waiting import wait_until
from rewards_membership.consumer.database import BatchApplier
from rewards_membership.consumer.partitions import PartitionControl
from rewards_membership.dlq.writer import DeadLetterer, DeadLetterResult
from rewards_membership.errors import CommitInDoubtError

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
SPEC_FIELDS = ("MessageId", "AgentUserId", "CompanyId", "Status", "Reason", "Version")


json_logs = fixtures.json_logs("rewards_membership", "rewards-membership")


def lines(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in found if line["event"] == event]


def test_each_event_is_logged_with_the_specs_fields_and_its_correlation(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Callable[..., Any],
    raw: Callable[..., bytes],
    json_logs: io.StringIO,
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    applied = event(agent, company, 1, membership_id=uuid.uuid4())
    value = raw(applied, CorrelationId="onboarding-77")
    message_id = msgspec.json.decode(value)["MessageId"]
    # Refused by the contract (no CompanyId), its bytes still say whose and which message.
    refused_id = uuid.uuid4()
    refused = {
        "MessageId": str(refused_id),
        "CorrelationId": "onboarding-78",
        "Payload": {"AgentUserId": str(agent), "Status": "Active", "Version": 2},
    }
    consumer = start_consumer()
    kafka.send_raw(
        (str(agent).encode(), value, [("traceparent", TRACEPARENT.encode())]),
        (str(agent).encode(), msgspec.json.encode(refused), None),
        (str(agent).encode(), b"\xff not json", None),
    )
    consumer.wait_handled(3)
    consumer.close()

    consumed = lines(json_logs, "consumed")
    assert len(consumed) == 3
    assert all(line["level"] == "INFO" for line in consumed)
    assert all(set(SPEC_FIELDS) <= set(line) for line in consumed)
    first, second, third = consumed
    assert (first["MessageId"], first["CorrelationId"], first["trace_id"]) == (
        message_id,
        "onboarding-77",
        TRACE_ID,
    )
    assert (first["AgentUserId"], first["CompanyId"], first["Version"]) == (
        str(agent),
        str(company),
        1,
    )

    [membership] = lines(json_logs, "membership-applied")
    assert (membership["MessageId"], membership["CorrelationId"], membership["trace_id"]) == (
        message_id,
        "onboarding-77",
        TRACE_ID,
    )

    dead = lines(json_logs, "dead-lettered")
    assert len(dead) == 2
    readable, unreadable = sorted(dead, key=lambda line: line["offset"])
    assert readable["MessageId"] == str(refused_id) == second["MessageId"]
    assert (readable["AgentUserId"], readable["Status"], readable["Version"]) == (
        str(agent),
        "Active",
        2,
    )
    assert (readable["CompanyId"], readable["Reason"]) == (None, None)
    assert readable["CorrelationId"] == "onboarding-78"
    # No traceparent of its own: the batch's trace where tracing is on, never another's.
    assert "trace_id" in readable
    assert readable["trace_id"] != TRACE_ID
    assert all(unreadable[name] is None for name in SPEC_FIELDS)
    assert third["MessageId"] is None


def test_consume_duration_is_observed_per_message_without_the_next_polls_wait(
    *, kafka: Any, start_consumer: Any, event: Callable[..., Any]
) -> None:
    # A poll timeout far longer than a batch takes: an offset commit that waited for the
    # next poll would show it in every observation.
    consumer = start_consumer(poll_timeout=timedelta(seconds=5))
    kafka.send(*(event(uuid.uuid4(), uuid.uuid4(), 1) for _ in range(3)))
    consumer.wait_handled(3)
    count = "rewards_membership_consume_duration_ms_count"
    wait_until(lambda: consumer.value(count) == 3, 30, "one observation per message")
    assert consumer.value("rewards_membership_consume_duration_ms_sum") / 3 < 2500
    consumer.close()


def test_a_batch_that_fails_after_its_commit_is_reported_once_as_what_it_was(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Callable[..., Any],
    json_logs: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The database commits the batch, then its offset commit fails (the broker went away):
    # the batch is retried, finds its records applied, and must report them as applied,
    # not as duplicates of itself.
    commit = PartitionControl.commit
    failures: list[object] = []

    def flaky(self: PartitionControl, partitions: Any = None, *, raise_errors: bool) -> None:
        if raise_errors and not failures and self.ledger.committable(partitions):
            failures.append(partitions)
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker connection lost"))
        commit(self, partitions, raise_errors=raise_errors)

    monkeypatch.setattr(PartitionControl, "commit", flaky)
    four_applied_once_after_a_retry(kafka, start_consumer(), event, json_logs, failures)


def four_applied_once_after_a_retry(
    kafka: Any,
    consumer: Any,
    event: Callable[..., Any],
    json_logs: io.StringIO,
    failed: list[object],
) -> None:
    """Four new events through a consumer whose first try of their batch fails (`failed`
    gets an entry then): each reported once, as applied, none as a duplicate."""
    payloads = [event(uuid.uuid4(), uuid.uuid4(), 1) for _ in range(4)]
    kafka.send(*payloads)
    consumer.wait_handled(4)
    wait_until(lambda: failed and consumer.total("rewards_membership_retries_total") >= 1, 30)
    wait_until(lambda: consumer.total("rewards_membership_applied_total") >= 4, 30)
    assert consumer.total("rewards_membership_applied_total") == 4
    assert consumer.total("rewards_membership_skipped_duplicate_total") == 0
    consumer.close()
    assert len(lines(json_logs, "membership-applied")) == 4
    assert lines(json_logs, "skipped-duplicate") == []


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "rolled-back"])
def test_a_batch_whose_commit_went_unanswered_is_reported_once_as_what_it_was(
    *,
    committed: bool,
    kafka: Any,
    start_consumer: Any,
    event: Callable[..., Any],
    json_logs: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The connection goes after the batch's statement answered and before its COMMIT did
    # (PostgreSQL stopped mid-commit): the transaction committed or not, the consumer cannot
    # tell. Its retry can: records it finds in the inbox are the ones that try committed,
    # reported as what that try decided; records it does not find are decided anew. Either
    # way each record is reported once, as applied, none as a duplicate.
    apply = BatchApplier._apply
    unanswered: list[object] = []

    def commit_unanswered(
        self: BatchApplier, records: Any, document: bytes, lock_timeout_ms: int | None = None
    ) -> Any:
        if unanswered:
            return apply(self, records, document, lock_timeout_ms)
        if committed:
            apply(self, records, document, lock_timeout_ms)  # the answer to COMMIT lost
        else:
            conn = self._store.connection()
            with conn.transaction(force_rollback=True):  # decided, never committed
                outcomes = self._store.apply(conn, document)
            for record, outcome in zip(records, outcomes, strict=True):
                record.outcome = outcome
        unanswered.append([record.outcome for record in records])
        lost = psycopg.OperationalError("server closed the connection unexpectedly")
        raise CommitInDoubtError(lost) from lost

    monkeypatch.setattr(BatchApplier, "_apply", commit_unanswered)
    four_applied_once_after_a_retry(kafka, start_consumer(), event, json_logs, unanswered)


@pytest.mark.parametrize("failures", [1, 2], ids=["once", "twice"])
def test_a_dead_letter_not_written_reports_the_rest_of_its_partition_once_as_what_it_was(
    *,
    failures: int,
    kafka: Any,
    start_consumer: Any,
    event: Callable[..., Any],
    raw: Callable[..., bytes],
    json_logs: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One batch on one partition (one agent, the key): changes applied, a stale one, an
    # unknown Status and an unknown Reason, and a record the contract refuses. The batch's
    # transaction commits; its dead letter cannot be written (the DLQ topic does not exist
    # yet: a retriable failure), so that partition alone is sought back and read again. The
    # topic is created as soon as the write failed `failures` times: the retry after it
    # must report the records the first try committed as what they were, not as duplicates
    # (a retry that fails too sees them as duplicates of the first try, and reports nothing).
    dlq = f"pin-test.dlq-missing.{uuid.uuid4().hex[:8]}"
    write = DeadLetterer.write
    failed: list[DeadLetterResult] = []

    def write_then_create(self: DeadLetterer, records: Any, *, batch: Any = None) -> Any:
        result = write(self, records, batch=batch)
        if result.failed and len(failed) < failures:
            failed.append(result)
            if len(failed) == failures:
                ensure_topics(create_admin(kafka.bootstrap, client_id="rm-test"), [(dlq, 3)])
        return result

    monkeypatch.setattr(DeadLetterer, "write", write_then_create)
    agent = uuid.uuid4()
    first, left, unknown_status, unknown_reason, last = (uuid.uuid4() for _ in range(5))
    applied = [
        envelope_for(event(agent, first, 1)),
        envelope_for(event(agent, left, 2, "Left", reason="SelfLeave")),
    ]
    stale = envelope_for(event(agent, left, 1))
    oddities = [
        raw(event(agent, unknown_status, 1, "Suspended")),
        raw(event(agent, unknown_reason, 1, "Left", reason="Retired")),
    ]
    refused = raw(event(agent, EMPTY_GUID, 1, membership_id=uuid.uuid4()))
    after = envelope_for(event(agent, last, 1))
    key = str(agent).encode()
    kafka.send_raw(
        *map(record_of, [*applied, stale]),
        *((key, value, None) for value in [*oddities, refused]),
        record_of(after),
    )
    consumer = start_consumer(dlq_topic=dlq)
    consumer.wait_handled(7)
    assert len(failed) == failures
    consumer.close()

    # What one clean run of these seven records reports, metrics and lines alike.
    assert consumer.value("rewards_membership_retries_total", dependency="kafka") == failures
    assert len(lines(json_logs, "dead letter not written")) == failures
    assert consumer.value("rewards_membership_applied_total", status="Active") == 2
    assert consumer.value("rewards_membership_applied_total", status="Left") == 3
    totals = {
        name: consumer.total(name)
        for name in (
            "rewards_membership_applied_total",
            "rewards_membership_skipped_stale_total",
            "rewards_membership_skipped_duplicate_total",
            "rewards_membership_unknown_status_total",
            "rewards_membership_unknown_reason_total",
            "rewards_identity_membership_dlq_total",
        )
    }
    assert totals == {
        "rewards_membership_applied_total": 5,
        "rewards_membership_skipped_stale_total": 1,
        "rewards_membership_skipped_duplicate_total": 0,
        "rewards_membership_unknown_status_total": 1,
        "rewards_membership_unknown_reason_total": 1,
        "rewards_identity_membership_dlq_total": 1,
    }
    odd_ids = [msgspec.json.decode(value)["MessageId"] for value in oddities]

    def ids(event: str) -> list[str]:
        return sorted(line["MessageId"] for line in lines(json_logs, event))

    assert ids("membership-applied") == sorted(
        [*(str(e.message_id) for e in [*applied, after]), *odd_ids]
    )
    assert ids("skipped-stale-membership") == [str(stale.message_id)]
    assert ids("skipped-duplicate") == []
    assert ids("unknown-membership-status") == [odd_ids[0]]
    assert ids("unknown-leave-reason") == [odd_ids[1]]
    assert ids("dead-lettered") == [msgspec.json.decode(refused)["MessageId"]]


def test_every_line_of_an_event_carries_its_trace_and_correlation_from_consumed_on(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Callable[..., Any],
    raw: Callable[..., bytes],
    json_logs: io.StringIO,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = uuid.uuid4()
    traced = raw(event(agent, uuid.uuid4(), 1), CorrelationId="onboarding-80")
    untraced = raw(event(agent, uuid.uuid4(), 1), CorrelationId="onboarding-81")
    refused = msgspec.json.encode({"MessageId": str(uuid.uuid4()), "CorrelationId": "x-82"})
    consumer = start_consumer(tracer=provider.get_tracer("test"))
    kafka.send_raw(
        (str(agent).encode(), traced, [("traceparent", TRACEPARENT.encode())]),
        (str(agent).encode(), untraced, None),
        (str(agent).encode(), refused, None),
    )
    consumer.wait_handled(3)
    consumer.close()

    # The batches' traces: where a record without a traceparent of its own is followed.
    batches = {
        format(s.context.trace_id, "032x")
        for s in exporter.get_finished_spans()
        if s.name == f"process {kafka.topic}" and format(s.context.trace_id, "032x") != TRACE_ID
    }
    assert batches
    consumed = {line["CorrelationId"]: line for line in lines(json_logs, "consumed")}
    assert set(consumed) == {"onboarding-80", "onboarding-81", "x-82"}
    assert consumed["onboarding-80"]["trace_id"] == TRACE_ID
    assert consumed["onboarding-81"]["trace_id"] in batches
    assert consumed["x-82"]["trace_id"] in batches
    # Its later lines carry the same trace (and correlation) as its `consumed` line.
    later = lines(json_logs, "membership-applied") + lines(json_logs, "dead-lettered")
    assert len(later) == 3
    for line in later:
        assert line["trace_id"] == consumed[line["CorrelationId"]]["trace_id"], line
