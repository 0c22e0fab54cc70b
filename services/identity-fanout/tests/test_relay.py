"""The outbox relay against a real PostgreSQL and a real Kafka broker (no mocks)."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Message
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from relay_support import (
    RelayFactory,
    RelayThread,
    access_event,
    access_topic,
    outbox_count,
    write,
)

from identity_fanout.ops.outbox import outbox_status
from identity_fanout.outbox.relay import DELETE_SPAN, LaneSession, OutboxRelay
from identity_fanout.outbox.writer import outbox_message
from identity_fanout.schema import OUTBOX, OUTBOX_TABLES
from pin_contracts import (
    MESSAGE_ID_HEADER,
    TRACEPARENT_HEADER,
    Topic,
    decode_access_changed,
    header_text,
)
from pin_runtime.http import ComponentState
from pin_runtime.kafka import record_headers
from pin_runtime.migrations import advisory_lock_key
from pin_runtime.postgres import SessionLimits, notify
from pin_testkit.ports import free_port
from pin_testkit.records import consume
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[tuple[Any, ...]]


# -- helpers ------------------------------------------------------------------------------


def outbox_ids(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM identity.outbox ORDER BY id")]


def headers_of(record: Message) -> list[tuple[str, str | bytes | None]]:
    return record_headers(record)


def is_active(relay: OutboxRelay) -> bool:
    """`relay.active` read anew (keeps mypy from narrowing the property across calls)."""
    return relay.active


def sample(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


@pytest.fixture
def dsn(identity_dsn: str) -> str:
    """A migrated identity database of this test alone (conftest's `identity_dsn`)."""
    return identity_dsn


@pytest.fixture
def topic(kafka_topic: Callable[..., str]) -> Topic:
    return access_topic(kafka_topic(partitions=3))


# -- tests --------------------------------------------------------------------------------


def test_publishes_exact_records_keeps_writer_trace_and_empties_outbox(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    writer = TracerProvider().get_tracer("writer")
    envelopes = [access_event() for _ in range(5)]
    with writer.start_as_current_span("set-role-permissions") as write_span:
        messages = [outbox_message(e, topic) for e in envelopes]
    write(dsn, messages)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    relay = make_relay(tracer_provider=provider)

    assert relay.run_once() == 5
    assert outbox_count(dsn) == 0

    by_id = {str(m.message_id): m for m in messages}
    for record in consume(kafka_bootstrap, topic.name, 5):
        headers = headers_of(record)
        stored = by_id.pop(header_text(headers, MESSAGE_ID_HEADER) or "")
        assert record.key() == stored.key.encode()
        assert record.value() == stored.value
        assert [(n, v) for n, v in headers] == [(n, v.encode()) for n, v in stored.headers]
        envelope = decode_access_changed(record.value())
        assert str(envelope.message_id) == str(stored.message_id)
        assert record.key() == str(envelope.payload.user_id).encode()
        # The writer's context, not the relay's: the trace runs from the transaction.
        traceparent = header_text(headers, TRACEPARENT_HEADER) or ""
        assert traceparent.split("-")[1] == f"{write_span.get_span_context().trace_id:032x}"
    assert by_id == {}

    spans = exporter.get_finished_spans()
    [span] = [s for s in spans if s.name.startswith("send")]
    assert span.kind is SpanKind.CLIENT
    assert span.name == f"send {topic.name}"
    assert span.attributes is not None
    assert span.attributes["messaging.system"] == "kafka"
    assert span.attributes["messaging.destination.name"] == topic.name
    assert span.attributes["messaging.batch.message_count"] == 5
    assert [link.context.span_id for link in span.links] == [write_span.get_span_context().span_id]
    # The rows' delete, linked to their send.
    [delete] = [s for s in spans if s.name == DELETE_SPAN]
    assert [link.context.span_id for link in delete.links] == [span.context.span_id]
    assert delete.attributes is not None
    assert delete.attributes["db.operation.batch.size"] == 5


def test_outbox_published_carries_its_delete_span_and_the_writers_traces(
    dsn: str, topic: Topic, make_relay: RelayFactory, json_logs: io.StringIO
) -> None:
    writer = TracerProvider().get_tracer("writer")
    traces = []
    for _ in range(2):  # two transactions, each traced: two writers' traces
        with writer.start_as_current_span("set-role-permissions") as write_span:
            write(dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        traces.append(f"{write_span.get_span_context().trace_id:032x}")
    write(dsn, [outbox_message(access_event(), topic)])  # and a row written untraced
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    relay = make_relay(tracer_provider=provider)

    assert relay.run_once() == 7
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    published = [line for line in lines if line["event"] == "outbox published"]
    spans = exporter.get_finished_spans()
    deletes = {f"{s.context.span_id:016x}": s for s in spans if s.name == DELETE_SPAN}
    assert published
    assert sum(line["count"] for line in published) == 7
    # Each line's trace and span: its delete's, whose links lead to the sends of its rows ...
    for line in published:
        delete = deletes[line["span_id"]]
        assert line["trace_id"] == f"{delete.context.trace_id:032x}"
    sends = {s.context.span_id for s in spans if s.name.startswith("send")}
    linked = {link.context.span_id for s in deletes.values() for link in s.links}
    assert linked == sends
    # ... and the traces that wrote the rows, which their consumers' lines carry.
    assert sorted({t for line in published for t in line["traceIds"]}) == sorted(traces)


def test_rows_of_one_key_arrive_in_outbox_id_order(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    user = uuid.uuid4()
    # Several transactions and several relay rounds (batch 40 < 150 rows).
    for start in range(1, 151, 50):
        write(dsn, [outbox_message(access_event(user, v), topic) for v in range(start, start + 50)])
    other = [outbox_message(access_event(), topic) for _ in range(10)]
    write(dsn, other)
    relay = make_relay(batch_size=40)

    rounds = []
    while (published := relay.run_once()) > 0:
        rounds.append(published)
    # One record of a key in flight at a time: the user's 150 rows take a round each, whatever
    # the batch size (the 10 other keys, written after them, go with the last ones).
    assert sum(rounds) == 160
    assert 150 <= len(rounds) < 160

    records = consume(kafka_bootstrap, topic.name, 160)
    mine = [r for r in records if r.key() == str(user).encode()]
    assert [decode_access_changed(r.value()).payload.version for r in mine] == list(range(1, 151))
    assert len({r.partition() for r in mine}) == 1


def test_unreachable_kafka_keeps_every_row_then_a_live_broker_gets_them_all(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    messages = [outbox_message(access_event(), topic) for _ in range(7)]
    write(dsn, messages)
    before = outbox_ids(dsn)
    state = ComponentState()
    registry = CollectorRegistry()
    dead = make_relay(
        bootstrap=f"127.0.0.1:{free_port()}",
        delivery_timeout=1.5,
        registry=registry,
        state=state,
    )

    assert dead.run_once() == 0
    result = dead.last_round
    assert result is not None
    assert result.active
    assert (result.read, result.published, result.failed) == (7, 0, 7)
    assert result.error is not None
    assert outbox_ids(dsn) == before  # nothing deleted
    # One stopped flow: one failure, however many rows go out again with it.
    assert sample(registry, "identity_outbox_delivery_failures_total") == 1
    assert sample(registry, "identity_outbox_published_total") == 0
    assert sample(registry, "identity_outbox_backlog") == 7
    check = state()
    assert check.status == "degraded"
    assert "kafka" in check.detail

    dead.close()  # releases the lock for the relay on the live broker
    live = make_relay()
    assert live.run_once() == 7
    assert outbox_count(dsn) == 0
    received = consume(kafka_bootstrap, topic.name, 7)
    assert sorted(r.value() or b"" for r in received) == sorted(m.value for m in messages)


def test_readiness_is_degraded_while_every_broker_is_unreachable_before_any_delivery_fails(
    dsn: str, topic: Topic, make_relay: RelayFactory
) -> None:
    """An outage shows in /readyz at once, not after RELAY_DELIVERY_TIMEOUT: before, librdkafka
    kept the rows queued without an error for that long and the rounds between said ok (an
    operator saw 13 of 14 samples ok during a Kafka outage while 10,051 rows waited)."""
    write(dsn, [outbox_message(access_event(), topic) for _ in range(5)])
    state = ComponentState()
    relay = make_relay(bootstrap=f"127.0.0.1:{free_port()}", delivery_timeout=120.0, state=state)
    stop = threading.Event()
    runner = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    runner.start()
    try:
        # Well within the delivery timeout: only the brokers' state can tell.
        wait_until(lambda: "unreachable" in state().detail, 60, "the relay degraded")
        assert state().status == "degraded"
        assert relay.last_round is not None
        assert relay.last_round.error is None  # no delivery has failed yet
    finally:
        stop.set()
        runner.join(30)
    assert outbox_count(dsn) == 5


Cut = Callable[[], None]


@pytest.fixture
def cut_relay_session(dsn: str, postgres_admin_dsn: str) -> Cut:
    """`cut_relay_session()`: the active relay's database session terminated, as a
    failover or a network cut would end it (its lane locks end with it)."""

    def cut() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            status = outbox_status(conn, OUTBOX)
        assert status.relay is not None
        with psycopg.connect(postgres_admin_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (status.relay.pid,))

    return cut


def test_one_active_relay_and_take_over_when_its_connection_dies(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory, cut_relay_session: Cut
) -> None:
    write(dsn, [outbox_message(access_event(), topic) for _ in range(3)])
    first, second = make_relay(), make_relay()

    assert first.run_once() == 3
    write(dsn, [outbox_message(access_event(), topic) for _ in range(4)])
    assert second.run_once() == 0
    assert (first.active, second.active) == (True, False)
    assert outbox_count(dsn) == 4  # the standby did not touch them
    cut_relay_session()
    wait_until(lambda: second.run_once() > 0 or second.active, 10, "standby takes over")
    wait_until(lambda: outbox_count(dsn) == 0, 10, "take-over relay publishes")
    assert second.active

    # The old holder finds its connection gone, and then stays standby.
    with pytest.raises(psycopg.OperationalError):
        first.run_once()
    assert not first.active
    assert first.run_once() == 0
    assert not first.active
    consume(kafka_bootstrap, topic.name, 7)


def test_running_relays_share_the_lanes_and_fail_over_within_seconds(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    # Two instances share the 8 lanes (4 each); one stops: the other holds all 8 at once.
    first, second = make_relay(poll_interval=0.2), make_relay(poll_interval=0.2)
    with RelayThread(first) as a, RelayThread(second):
        wait_until(
            lambda: len(first.lanes) == 4 and len(second.lanes) == 4, 10, "lanes shared 4 + 4"
        )
        assert first.lanes.isdisjoint(second.lanes)

        a.stop.set()  # graceful stop: the instance gives its lanes back
        a.thread.join(timeout=30)
        assert not first.active
        took = wait_until(lambda: len(second.lanes) == 8, 10, "the other takes every lane")
        assert took < 5
        write(dsn, [outbox_message(access_event(), topic) for _ in range(20)])
        wait_until(lambda: outbox_count(dsn) == 0, 10, "the remaining instance publishes")
    consume(kafka_bootstrap, topic.name, 20)


def test_notify_wakes_the_running_relay_long_before_the_poll_interval(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    relay = make_relay(poll_interval=30.0)
    with RelayThread(relay):
        wait_until(lambda: relay.last_round is not None and relay.active, 10, "relay active")
        write(dsn, [outbox_message(access_event(), topic)])
        took = wait_until(lambda: outbox_count(dsn) == 0, 10, "row published after NOTIFY")
    assert took < 5
    consume(kafka_bootstrap, topic.name, 1)


def test_a_hot_keys_rows_go_out_one_after_the_other_without_waiting_for_a_wake(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    """One key's rows go out one round trip apart (one in flight per key); the rows held
    behind it are read again as soon as it settles, not at the next NOTIFY or poll."""
    user = uuid.uuid4()
    relay = make_relay(poll_interval=30.0, read_cooldown=0)
    with RelayThread(relay):
        wait_until(lambda: relay.last_round is not None and relay.active, 10, "relay active")
        write(dsn, [outbox_message(access_event(user, v), topic) for v in range(1, 21)])
        wait_until(lambda: outbox_count(dsn) == 0, 20, "20 rows of one key, poll at 30 s")
    records = consume(kafka_bootstrap, topic.name, 20)
    assert [decode_access_changed(r.value()).payload.version for r in records] == list(range(1, 21))


def test_running_relay_survives_losing_its_database_connection(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory, cut_relay_session: Cut
) -> None:
    state = ComponentState()
    relay = make_relay(poll_interval=0.2, state=state)
    with RelayThread(relay):
        wait_until(lambda: relay.active, 10, "relay active")
        cut_relay_session()
        write(dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        wait_until(lambda: outbox_count(dsn) == 0, 15, "relay reconnects and publishes")
        assert relay.active
        assert state().status == "ok"
    assert not is_active(relay)
    consume(kafka_bootstrap, topic.name, 3)


def test_a_row_another_session_locks_holds_only_its_delete_never_the_flow(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    # A neighbour's long transaction locks a published row: its DELETE meets the lock
    # timeout and waits for a later try, and the relay keeps its lanes and publishes on. A
    # failed DELETE that dropped the lanes sent every row in flight again, round after round,
    # for as long as the lock was held.
    lost: list[int] = []
    relay = make_relay(
        poll_interval=0.2,
        session=SessionLimits(lock_timeout=0.2),
        probe=lambda event, lane: lost.append(lane) if event == "lost" else None,
    )
    write(dsn, [outbox_message(access_event(), topic)])
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT id FROM identity.outbox FOR UPDATE")  # held, uncommitted
        with RelayThread(relay):
            consume(kafka_bootstrap, topic.name, 1)
            write(dsn, [outbox_message(access_event(), topic) for _ in range(3)])
            consume(kafka_bootstrap, topic.name, 4)  # the rows behind it went out
            assert outbox_count(dsn) >= 1  # the locked row's DELETE waits
            holder.rollback()
            wait_until(lambda: outbox_count(dsn) == 0, 15, "the deletes done once unlocked")
            assert relay.active
    assert lost == []


def test_metrics_follow_the_backlog(
    dsn: str, topic: Topic, make_relay: RelayFactory, kafka_bootstrap: str
) -> None:
    write(dsn, [outbox_message(access_event(), topic) for _ in range(5)])
    registry, standby_registry = CollectorRegistry(), CollectorRegistry()
    relay = make_relay(batch_size=2, registry=registry)
    standby = make_relay(registry=standby_registry)

    assert relay.run_once() == 2
    assert sample(registry, "identity_outbox_backlog") == 3
    assert sample(registry, "identity_outbox_published_total") == 2
    assert sample(registry, "identity_outbox_oldest_age_seconds") > 0
    assert sample(registry, "identity_outbox_relay_active") == 1
    assert sample(registry, "identity_outbox_delivery_failures_total") == 0
    # A standby reports the backlog too: the "events are late" alert works without a holder.
    assert standby.run_once() == 0
    assert sample(standby_registry, "identity_outbox_backlog") == 3
    assert sample(standby_registry, "identity_outbox_relay_active") == 0
    assert sample(standby_registry, "identity_outbox_lanes_held") == 0
    assert sample(registry, "identity_outbox_lanes_held") == 8

    standby.close()  # alone again: the relay keeps every lane (else it would hand 4 over)
    # Rounds until the outbox is empty: a round may publish nothing while the window's
    # acknowledgements are still on their way.
    wait_until(
        lambda: relay.run_once() == 0 and sample(registry, "identity_outbox_backlog") == 0,
        timeout=30,
        what="the relay drained the outbox",
    )
    assert sample(registry, "identity_outbox_backlog") == 0
    assert sample(registry, "identity_outbox_oldest_age_seconds") == 0
    assert sample(registry, "identity_outbox_published_total") == 5
    relay.close()
    assert sample(registry, "identity_outbox_relay_active") == 0
    consume(kafka_bootstrap, topic.name, 5)


def test_outbox_status_figures(
    dsn: str, topic: Topic, kafka_topic: Callable[..., str], make_relay: RelayFactory
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        empty = outbox_status(conn, OUTBOX)
    assert (empty.backlog, empty.by_topic, empty.relay_active) == (0, {}, False)
    assert empty.oldest_created_at is None
    assert empty.oldest_age_seconds is None

    relay = make_relay()
    assert relay.run_once() == 0  # an empty round that takes the lock
    other = access_topic(kafka_topic(partitions=1))
    write(dsn, [outbox_message(access_event(), topic) for _ in range(3)])
    write(dsn, [outbox_message(access_event(), other) for _ in range(2)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        status = outbox_status(conn, OUTBOX)
        head = conn.execute("SELECT created_at FROM identity.outbox ORDER BY id LIMIT 1")
        [(head_created_at,)] = head.fetchall()
    assert status.backlog == 5
    assert status.by_topic == {topic.name: 3, other.name: 2}
    assert status.oldest_created_at == head_created_at
    assert status.oldest_age_seconds is not None
    assert status.oldest_age_seconds >= 0
    assert status.relay_active
    assert status.relay is not None
    assert status.relay.application_name is not None
    assert status.relay.application_name.startswith("identity-fanout-relay@")

    relay.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert not outbox_status(conn, OUTBOX).relay_active


def test_lock_classes_are_documented_recipe_and_distinct() -> None:
    for name, cls in (
        (b"pin-outbox-relay:identity.outbox", OUTBOX_TABLES.lane_lock_class),
        (b"pin-outbox-relay-members:identity.outbox", OUTBOX_TABLES.member_lock_class),
    ):
        assert int.from_bytes(hashlib.sha256(name).digest()[:4], "big") & 0x7FFFFFFF == cls
    assert OUTBOX_TABLES.lane_lock_class != OUTBOX_TABLES.member_lock_class
    # The migration lock is a bigint key (objsubid 1), these are two-int4 keys (objsubid 2):
    # they can never be the same lock, whatever the numbers.
    assert isinstance(advisory_lock_key("identity"), int)


def test_one_wake_takes_every_notify_the_session_received_meanwhile(relay_dsn: str) -> None:
    # Each writer commit NOTIFYs once. Those that come while the relay runs statements are
    # kept by psycopg; taken one per wait, every one of them cost each relay another read
    # and backlog count, so the relays' statements per row grew with the writers.
    session = LaneSession(
        relay_dsn,
        lanes=8,
        store=OUTBOX,
        application_name="notify-drain-test",
        limits=SessionLimits(),
    )
    try:
        conn = session.connection()
        for _ in range(5):  # its own NOTIFYs reach it at each commit, before the answer
            notify(conn, OUTBOX_TABLES.channel)
        ticks: list[None] = []
        session.wait_for_notify(30.0, stop=threading.Event(), on_tick=lambda: ticks.append(None))
        assert ticks == []  # woken at once
        assert list(conn.notifies(timeout=0)) == []  # and nothing left for another look
    finally:
        session.close()


def test_commits_during_the_cooldown_after_a_caught_up_read_go_out_in_one_read(
    dsn: str, topic: Topic, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    # Every key in one slot, so each read that produces any of them probes the slot once.
    with psycopg.connect(dsn) as db:  # the slot is the database's to say (outbox_key_slot)
        users = [
            uuid.UUID(str(user))
            for (user,) in db.execute(
                "SELECT u FROM (SELECT gen_random_uuid() AS u FROM generate_series(1, 5000)) AS s"
                " WHERE identity.outbox_key_slot(u::text) = 0 LIMIT 5"
            )
        ]
    produced: list[int] = []

    def probe(event: str, slot: int) -> None:
        if event == "produced" and slot == 0:
            produced.append(slot)

    relay = make_relay(read_cooldown=5.0, poll_interval=0.2, probe=probe)
    with RelayThread(relay):
        wait_until(lambda: relay.active, 10, "relay active")
        # After a quiet spell the first row is read at once, the cooldown notwithstanding.
        write(dsn, [outbox_message(access_event(users[0]), topic)])
        wait_until(lambda: outbox_count(dsn) == 0, 4, "the first row, at once")
        # Four more commits, each woken for (NOTIFY), spread over a second of the cooldown.
        for user in users[1:]:
            write(dsn, [outbox_message(access_event(user), topic)])
            time.sleep(0.25)  # spacing the commits, not waiting for anything
        wait_until(lambda: outbox_count(dsn) == 0, 15, "the four after the cooldown")
    assert len(produced) == 2  # one read for the first row, one for the four
    consume(kafka_bootstrap, topic.name, 5)
