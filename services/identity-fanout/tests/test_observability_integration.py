"""What an operator sees of a task run: the spec's log events and spans, with their fields."""

from __future__ import annotations

import io
import json
import uuid
from datetime import timedelta

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from worker_support import new_worker

from identity_fanout.fanout.enqueue import set_role_permissions
from pin_testkit.seeding import add_permissions, seed_role_with_users

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


def test_task_run_logs_and_traces_what_the_spec_names(
    db: Conn,
    json_logs: io.StringIO,
    operator_db: Conn,
    pool: ConnectionPool[Conn],
    worker_dsn: str,
) -> None:
    role, users = seed_role_with_users(db, users=25, other_roles=0)
    add_permissions(db, ["p.x"])
    change = set_role_permissions(operator_db, role, ["p.x"], inline_threshold=0)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    worker, _ = new_worker(
        worker_dsn,
        pool,
        batch_size=10,
        polling=timedelta(seconds=5),
        max_attempts=3,
        tracer=provider.get_tracer("test"),
    )
    assert worker.run_once()

    records = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    by_event: dict[str, list[dict[str, object]]] = {}
    for record in records:
        by_event.setdefault(str(record["event"]), []).append(record)
    [started] = by_event["job started"]
    run_id = started["jobRunId"]
    [dequeued] = by_event["task dequeued"]
    assert (dequeued["taskId"], dequeued["roleId"], dequeued["attempt"]) == (
        str(change.task_id),
        str(role),
        1,
    )
    batches = by_event["batch processed"]
    assert [b["rows"] for b in batches] == [10, 10, 5]
    assert batches[-1]["cursor"] == str(users[-1])
    assert {b["roleId"] for b in batches} == {str(role)}
    [completed] = by_event["task completed"]
    assert (completed["roleId"], completed["processedCount"]) == (str(role), 25)
    assert isinstance(completed["durationMs"], float)
    assert {r["jobRunId"] for r in records if "jobRunId" in r} == {run_id}
    # No PII: the events carry ids and counts only.
    assert not any(key.lower() in {"email", "phone", "name"} for r in records for key in r)

    spans = {s.name: s for s in exporter.get_finished_spans()}
    task_span = spans["access-fanout task"]
    assert task_span.attributes is not None
    assert task_span.attributes["jobRunId"] == run_id
    assert task_span.attributes["taskId"] == str(change.task_id)
    assert task_span.attributes["roleId"] == str(role)
    assert task_span.attributes["batchSize"] == 10
    assert task_span.attributes["processedCount"] == 25
    batch_spans = [s for s in exporter.get_finished_spans() if s.name == "access-fanout batch"]
    assert len(batch_spans) == 3
    assert all(
        s.parent is not None and s.parent.span_id == task_span.context.span_id for s in batch_spans
    )

    # The events carry the run as correlation id and the batch's trace context.
    headers = db.execute("SELECT headers FROM identity.outbox ORDER BY id LIMIT 1").fetchone()
    assert headers is not None
    traceparent = dict(headers[0])["traceparent"]
    assert traceparent.split("-")[1] == format(task_span.context.trace_id, "032x")
    assert str(uuid.UUID(str(run_id))) == run_id


def test_a_sharded_task_is_one_dequeue_one_span_and_a_truthful_row(
    db: Conn,
    json_logs: io.StringIO,
    operator_db: Conn,
    pool: ConnectionPool[Conn],
    worker_dsn: str,
) -> None:
    role, _ = seed_role_with_users(db, users=120, other_roles=0)
    add_permissions(db, ["p.y"])
    change = set_role_permissions(operator_db, role, ["p.y"], inline_threshold=0)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rows: list[tuple[object, ...]] = []

    def task_row_now(*_: object) -> None:
        row = db.execute(
            "SELECT t.attempt_count, t.lease_expires_at, s.attempt_count, s.lease_expires_at "
            "FROM identity.access_fanout_tasks t JOIN identity.access_fanout_shards s "
            "ON s.task_id = t.id AND s.status = 'InProgress' WHERE t.id = %s",
            (change.task_id,),
        ).fetchone()
        if row is not None:
            rows.append(tuple(row))

    worker, metrics = new_worker(
        worker_dsn,
        pool,
        batch_size=20,
        shard_size=40,
        tracer=provider.get_tracer("test"),
        on_batch=task_row_now,
    )
    while worker.run_once() is not None:
        pass

    # While a shard is walked, the task row shows its claim and lease (the only live one).
    assert rows
    assert all(
        t_attempt == s_attempt and t_lease == s_lease
        for t_attempt, t_lease, s_attempt, s_lease in rows
    )
    records = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    events = [str(r["event"]) for r in records]
    assert events.count("task dequeued") == 1
    assert events.count("shard dequeued") == 3
    assert events.count("task completed") == 1
    spans = exporter.get_finished_spans()
    [task_span] = [s for s in spans if s.name == "access-fanout task"]
    shard_spans = [s for s in spans if s.name == "access-fanout shard"]
    assert len(shard_spans) == 3
    # The task's span covers every shard's (its end is taken inside the last shard's).
    assert task_span.start_time is not None
    assert task_span.end_time is not None
    assert task_span.start_time <= min(s.start_time or 0 for s in shard_spans)
    assert task_span.end_time <= max(s.end_time or 0 for s in shard_spans)
    assert task_span.end_time >= max(s.start_time or 0 for s in shard_spans)
    [completed] = [r for r in records if r["event"] == "task completed"]
    row = db.execute(
        "SELECT extract(epoch FROM completed_at - started_at) * 1000, lease_expires_at "
        "FROM identity.access_fanout_tasks WHERE id = %s",
        (change.task_id,),
    ).fetchone()
    assert row is not None
    assert row[1] is None
    # durationMs is StartedAt -> completion, as for a task walked whole.
    assert abs(float(completed["durationMs"]) - float(row[0])) < 1000
    assert metrics.task_duration_ms._sum.get() == pytest.approx(completed["durationMs"], abs=1)


def test_every_line_of_a_run_carries_the_trace_its_events_carry(
    db: Conn,
    json_logs: io.StringIO,
    operator_db: Conn,
    pool: ConnectionPool[Conn],
    worker_dsn: str,
) -> None:
    role, _ = seed_role_with_users(db, users=90, other_roles=0)
    add_permissions(db, ["p.z"])
    change = set_role_permissions(operator_db, role, ["p.z"], inline_threshold=0)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    worker, _ = new_worker(
        worker_dsn, pool, batch_size=20, shard_size=40, tracer=provider.get_tracer("test")
    )
    while worker.run_once() is not None:
        pass

    spans = {f"{s.context.span_id:016x}": s for s in exporter.get_finished_spans()}
    records = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    of_the_run = {
        "job started",
        "task dequeued",
        "task split",
        "shard dequeued",
        "batch processed",
        "task completed",
    }
    lines = [r for r in records if r["event"] in of_the_run]
    assert {r["event"] for r in lines} == of_the_run
    for line in lines:
        # The span the line was written in, and its trace.
        span = spans[line["span_id"]]
        assert line["trace_id"] == f"{span.context.trace_id:032x}", line
    [dequeued] = [r for r in lines if r["event"] == "task dequeued"]
    assert spans[dequeued["span_id"]].name == "access-fanout split"
    assert dequeued["taskId"] == str(change.task_id)
    walked = [r for r in lines if r["event"] in ("shard dequeued", "batch processed")]
    assert {spans[r["span_id"]].name for r in walked} == {"access-fanout shard"}
    # The events of a batch carry its line's trace (traceparent) and jobRunId (CorrelationId):
    # what a log pipeline joins a consumer's lines on.
    batches = {(r["trace_id"], r["jobRunId"]) for r in lines if r["event"] == "batch processed"}
    runs = {run for _, run in batches}
    events = [
        (dict(headers)["traceparent"].split("-")[1], json.loads(bytes(payload))["CorrelationId"])
        for headers, payload in db.execute("SELECT headers, payload FROM identity.outbox")
    ]
    of_these_runs = [event for event in events if event[1] in runs]
    assert len(of_these_runs) == 90
    assert set(of_these_runs) == batches
