"""Sizes and quarantine of the outbox relay, against a real PostgreSQL and a real broker.

Topics are created with the catalogue's `max.message.bytes` (`Topic.config()`), as an
operator's cluster has them; rows written for the catalogue topic are pointed at this test's
topic by an UPDATE, the way the membership relay test does it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import relay_support as support
from confluent_kafka import KafkaException

# Re-exported by confluent_kafka.admin without __all__; mypy strict wants the defining modules.
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from prometheus_client import CollectorRegistry
from psycopg.rows import TupleRow

from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.membership import join_agency
from identity_fanout.outbox.settings import RELAY_MESSAGE_MAX_BYTES
from identity_fanout.outbox.writer import OutboxMessage, outbox_message
from identity_fanout.schema import OUTBOX
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    USER_ACCESS_CHANGED,
    AgentMembershipChanged,
    ScopeType,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
)
from pin_runtime.http import ComponentState
from pin_runtime.kafka import create_admin, ensure_topics
from pin_runtime.postgres import SessionLimits
from pin_testkit.records import read_messages
from pin_testkit.seeding import Assignment, add_assignments, add_permissions, add_role
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]
MIB = 1024 * 1024


# -- helpers ------------------------------------------------------------------------------


def opaque(topic: str, key: uuid.UUID, size: int, event_type: str) -> OutboxMessage:
    """A row of `size` incompressible bytes: what a limit sees, whatever the codec."""
    return OutboxMessage(
        topic=topic,
        key=str(key),
        value=os.urandom(size),
        headers=(),
        message_id=uuid.uuid4(),
        event_type=event_type,
    )


def raise_topic_limit(bootstrap: str, topic: str, limit: int) -> None:
    """What an operator does: `kafka-configs --alter --add-config max.message.bytes=...`."""
    admin = create_admin(bootstrap, client_id="quarantine-test")
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes",
                str(limit),
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def make_relay(make_relay: support.RelayFactory) -> support.RelayFactory:
    """conftest's relays with a 0.2 s polling interval, so a round follows a change soon."""
    return functools.partial(make_relay, poll_interval=0.2)


def log_lines(stream: io.StringIO, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == event]


# -- sizes --------------------------------------------------------------------------------


def test_a_user_with_20000_assignments_gets_their_access_event(
    *,
    db: Conn,
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: support.RelayFactory,
    operator_db: Conn,
) -> None:
    topic = kafka_topic(partitions=3, config=USER_ACCESS_CHANGED.config())
    company = uuid.uuid4()
    role = add_role(db, "big-holder", company_id=company, permissions=["p.read"])
    projects = [add_role(db, f"project-{i}", company_id=company) for i in range(20)]
    user, bystander = uuid.uuid4(), uuid.uuid4()
    groups = [uuid.uuid4() for _ in range(50)]

    def assignments() -> Iterator[Assignment]:
        yield Assignment(role_id=role, user_id=user, company_id=company)
        yield Assignment(role_id=role, user_id=bystander, company_id=company)
        for n in range(19_999):
            yield Assignment(
                role_id=projects[n % len(projects)],
                user_id=user,
                company_id=company,
                scope_type=ScopeType.PROJECT.value,
                scope_organization_id=company,
                scope_project_group_id=groups[n % len(groups)],
                scope_project_id=uuid.uuid4(),
            )

    add_assignments(db, assignments())
    add_permissions(db, ["p.write"])
    set_role_permissions(operator_db, role, ["p.read", "p.write"], inline_threshold=10)
    db.execute("UPDATE identity.outbox SET topic = %s", (topic,))
    registry = CollectorRegistry()
    relay = make_relay(registry=registry)  # the defaults: zstd, message.max.bytes 16 MiB

    assert relay.run_once() == 2
    assert support.outbox_count(identity_dsn) == 0
    assert sample(registry, "identity_outbox_quarantined_total") == 0

    records = {r.key(): r for r in read_messages(kafka_bootstrap, topic)}
    big = records[str(user).encode()]
    value = big.value() or b""
    assert len(value) > 1_000_000  # above the broker's default limit: the sizes are deliberate
    assert len(value) < RELAY_MESSAGE_MAX_BYTES
    snapshot = decode_access_changed(value).payload.active_assignments
    assert len(snapshot) == 20_000
    assert str(bystander).encode() in records


# -- quarantine ---------------------------------------------------------------------------


def test_rows_over_the_limits_are_quarantined_and_the_rows_behind_them_flow(
    *,
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: support.RelayFactory,
    json_logs: io.StringIO,
    operator_dsn: str,
) -> None:
    access = kafka_topic(partitions=3, config=USER_ACCESS_CHANGED.config())
    membership = kafka_topic(partitions=3, config=AGENT_MEMBERSHIP_CHANGED.config())
    poisoned_user, agent = uuid.uuid4(), uuid.uuid4()
    # Over the producer's message.max.bytes (16 MiB): produce() refuses it at once.
    too_big_access = opaque(
        access, poisoned_user, RELAY_MESSAGE_MAX_BYTES + MIB, UserAccessChangedKafkaEvent.EVENT_TYPE
    )
    # Under the producer's limit, over the membership topic's 1 MiB even compressed: the
    # broker refuses it in the delivery report.
    too_big_membership = opaque(membership, agent, 2 * MIB, AgentMembershipChanged.EVENT_TYPE)
    before = [
        outbox_message(support.access_event(), support.access_topic(access)) for _ in range(3)
    ]
    later_of_same_user = outbox_message(
        support.access_event(poisoned_user, 2), support.access_topic(access)
    )
    behind = [
        outbox_message(support.access_event(), support.access_topic(access)) for _ in range(3)
    ]
    support.write(identity_dsn, [*before, too_big_access, too_big_membership])
    support.write(identity_dsn, [later_of_same_user, *behind])
    with psycopg.connect(identity_dsn, autocommit=True) as conn:
        join_agency(conn, uuid.uuid4(), uuid.uuid4())  # a membership event recorded after
        conn.execute(
            "UPDATE identity.outbox SET topic = %s WHERE topic = %s",
            (membership, AGENT_MEMBERSHIP_CHANGED.name),
        )
        ids = [r[0] for r in conn.execute("SELECT id FROM identity.outbox ORDER BY id")]
    registry, state = CollectorRegistry(), ComponentState()
    relay = make_relay(registry=registry, state=state)

    with support.RelayThread(relay):
        took = wait_until(lambda: support.outbox_count(identity_dsn) == 0, 30, "the outbox drained")
    assert took < 10
    assert state().status == "ok"  # a quarantined row is not an outage

    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        quarantined = OUTBOX.quarantined(conn)
    assert [(q.outbox_id, q.topic, q.key) for q in quarantined] == [
        (ids[3], access, str(poisoned_user)),
        (ids[4], membership, str(agent)),
    ]
    refused_by_client, refused_by_broker = quarantined
    for row in quarantined:
        assert (row.error_code, row.error_reason, row.attempts) == (
            "MSG_SIZE_TOO_LARGE",
            "too-large",
            1,
        )
        assert row.first_failed_at == row.last_failed_at
    assert refused_by_client.size == RELAY_MESSAGE_MAX_BYTES + MIB
    assert refused_by_client.message_id == too_big_access.message_id
    # produce() refused one at once; the broker's delivery report the other.
    assert refused_by_client.error_message.startswith("Unable to produce message")
    assert refused_by_broker.error_message == "Broker: Message size too large"

    access_records = read_messages(kafka_bootstrap, access)
    delivered = {r.value() for r in access_records}
    assert delivered == {m.value for m in [*before, later_of_same_user, *behind]}
    # The later event of the quarantined user still went out.
    mine = [r for r in access_records if r.key() == str(poisoned_user).encode()]
    assert [decode_access_changed(r.value() or b"").payload.version for r in mine] == [2]
    membership_records = read_messages(kafka_bootstrap, membership)
    assert len(membership_records) == 1  # the join recorded after the refused row

    assert (
        sample(registry, "identity_outbox_quarantined_total", topic=access, reason="too-large") == 1
    )
    assert (
        sample(registry, "identity_outbox_quarantined_total", topic=membership, reason="too-large")
        == 1
    )
    assert sample(registry, "identity_outbox_quarantine_rows", topic=access) == 1
    assert sample(registry, "identity_outbox_quarantine_rows", topic=membership) == 1

    lines = log_lines(json_logs, "outbox row quarantined")
    assert len(lines) == 2
    by_topic = {line["topic"]: line for line in lines}
    assert by_topic[access]["userId"] == str(poisoned_user)
    assert by_topic[access]["outboxId"] == ids[3]
    assert by_topic[access]["errorCode"] == "MSG_SIZE_TOO_LARGE"
    assert by_topic[access]["reason"] == "too-large"
    assert by_topic[membership]["agentUserId"] == str(agent)
    assert by_topic[membership]["level"] == "ERROR"


def test_retry_counts_attempts_and_delivers_once_the_limit_is_raised(
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: support.RelayFactory,
    operator_dsn: str,
) -> None:
    topic = kafka_topic(partitions=3, config={"max.message.bytes": str(MIB)})
    user = uuid.uuid4()
    row = opaque(topic, user, 2 * MIB, UserAccessChangedKafkaEvent.EVENT_TYPE)
    support.write(identity_dsn, [row])
    small = make_relay(message_max_bytes=MIB)

    assert small.run_once() == 0
    assert small.last_round is not None
    assert small.last_round.quarantined == 1
    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        [first] = OUTBOX.quarantined(conn)
        # Retried before the cause is fixed: refused again, attempts count on.
        [requeued] = OUTBOX.requeue(conn, first.id)
        assert requeued.quarantine_id == first.id
        assert requeued.outbox_id > first.outbox_id  # the tail of the outbox, a new id
        assert small.run_once() == 0
        [second] = OUTBOX.quarantined(conn)
    assert second.attempts == 2
    assert second.first_failed_at == first.first_failed_at
    assert second.last_failed_at > first.last_failed_at
    assert second.outbox_id == requeued.outbox_id
    small.close()

    # The operator raises both limits, then retries everything.
    raise_topic_limit(kafka_bootstrap, topic, 4 * MIB)
    large = make_relay(message_max_bytes=4 * MIB)
    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        [back] = OUTBOX.requeue(conn, None)
        assert back.attempts == 2
        assert OUTBOX.quarantined(conn) == []
    assert large.run_once() == 1
    assert support.outbox_count(identity_dsn) == 0
    [record] = read_messages(kafka_bootstrap, topic)
    assert record.key() == str(user).encode()
    assert record.value() == row.value


def test_retries_of_a_refused_window_count_one_failure_each_not_the_window(
    *, identity_dsn: str, make_relay: support.RelayFactory
) -> None:
    # A missing topic refuses the whole window at every retry: each retry is one failure
    # (the flow stopped once), not the window's rows again.
    topic = support.access_topic(f"pin-test.missing.{uuid.uuid4().hex[:12]}")
    rows = 40
    support.write(
        identity_dsn, [outbox_message(support.access_event(), topic) for _ in range(rows)]
    )
    registry = CollectorRegistry()
    relay = make_relay(registry=registry)
    retries = 3
    for _ in range(retries):
        assert relay.run_once() == 0
        assert relay.pause is not None
    assert sample(registry, "identity_outbox_delivery_failures_total") == retries
    assert support.outbox_count(identity_dsn) == rows


def test_a_topic_that_does_not_exist_pauses_the_relay_and_quarantines_nothing(
    *,
    db: Conn,
    identity_dsn: str,
    kafka_bootstrap: str,
    make_relay: support.RelayFactory,
) -> None:
    # A deployment whose topic was not created yet: a refusal of the cluster, not of a row.
    topic = support.access_topic(f"pin-test.missing.{uuid.uuid4().hex[:12]}")
    support.write(identity_dsn, [outbox_message(support.access_event(), topic) for _ in range(5)])
    registry = CollectorRegistry()
    # A read cooldown far longer than the first backoff: the retries of the refused rows
    # must not wait for it, nor may a step inside it lift the pause.
    relay = make_relay(registry=registry, read_cooldown=2.0)
    paused = {"reason": "unknown-topic", "topic": topic.name}
    admin = create_admin(kafka_bootstrap, client_id="quarantine-test")
    try:
        with support.RelayThread(relay):
            wait_until(
                lambda: sample(registry, "identity_outbox_relay_paused", **paused) == 1,
                60,
                "relay paused for the missing topic",
            )
            pause = relay.pause
            assert pause is not None
            assert pause.failure.code == "UNKNOWN_TOPIC_OR_PART"
            # Refused again at each retry, the relay stays in the same pause throughout.
            failures = sample(registry, "identity_outbox_delivery_failures_total")
            wait_until(
                lambda: sample(registry, "identity_outbox_delivery_failures_total") >= failures + 2,
                60,
                "two more refused retries",
            )
            assert relay.pause is pause
            assert support.outbox_count(identity_dsn) == 5
            assert OUTBOX.quarantined(db) == []

            ensure_topics(admin, [(topic.name, topic.partitions, topic.config())])
            wait_until(lambda: support.outbox_count(identity_dsn) == 0, 60, "rows published")
            wait_until(lambda: relay.pause is None, 10, "relay resumed")
        assert sample(registry, "identity_outbox_relay_paused", **paused) == 0
        assert sample(registry, "identity_outbox_quarantined_total") == 0
        assert OUTBOX.quarantined(db) == []
        assert len(read_messages(kafka_bootstrap, topic.name)) >= 5
    finally:
        for future in admin.delete_topics([topic.name]).values():
            with contextlib.suppress(KafkaException):  # never created: nothing to delete
                future.result(timeout=30)


def test_a_refused_row_another_session_locks_waits_for_its_move_and_holds_nothing_else(
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: support.RelayFactory,
    operator_dsn: str,
) -> None:
    # A neighbour's long transaction locks a row Kafka refuses for good: its move into the
    # quarantine meets the lock timeout, and the relay keeps its lanes and publishes the
    # rows behind it; once the lock is gone the row is refused again and moved. A failed
    # move that failed the round dropped the lanes and sent every row in flight again, for
    # as long as the lock was held.
    topic = kafka_topic(partitions=3, config={"max.message.bytes": str(MIB)})
    refused = opaque(topic, uuid.uuid4(), 2 * MIB, UserAccessChangedKafkaEvent.EVENT_TYPE)
    support.write(identity_dsn, [refused])
    lost: list[int] = []
    relay = make_relay(
        message_max_bytes=MIB,
        poll_interval=0.2,
        session=SessionLimits(lock_timeout=0.2),
        probe=lambda event, lane: lost.append(lane) if event == "lost" else None,
    )
    good = [
        opaque(topic, uuid.uuid4(), 1000, UserAccessChangedKafkaEvent.EVENT_TYPE) for _ in range(3)
    ]
    with psycopg.connect(identity_dsn) as holder:
        holder.execute("SELECT id FROM identity.outbox FOR UPDATE")  # held, uncommitted
        with support.RelayThread(relay):
            support.write(identity_dsn, good)
            wait_until(
                lambda: len(read_messages(kafka_bootstrap, topic)) == 3,
                30,
                "the rows behind the locked refused row published",
            )
            assert support.outbox_count(identity_dsn) == 1  # the refused row waits
            with psycopg.connect(operator_dsn, autocommit=True) as conn:
                assert OUTBOX.quarantined(conn) == []
            holder.rollback()
            wait_until(
                lambda: support.outbox_count(identity_dsn) == 0, 30, "the move once unlocked"
            )
            assert relay.active
    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        [moved] = OUTBOX.quarantined(conn)
    assert moved.attempts == 1
    published = [m.key() or b"" for m in read_messages(kafka_bootstrap, topic)]
    assert sorted(published) == sorted(r.key.encode() for r in good)  # each once
    assert lost == []
