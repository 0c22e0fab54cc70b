"""Keys are part of the contract: every record the relay publishes, on both topics, is keyed
by its payload's key field (UserId on the access topic, AgentUserId on the membership
topic) as canonical UUID text, whichever producer wrote its row (the fan-out's page
statement, run by the worker's batch and the inline fan-out, builds its rows in SQL; the
membership writer in Python).

Real PostgreSQL and Kafka.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from relay_support import RelayFactory
from worker_support import enqueue, new_worker

from identity_fanout.fanout.enqueue import set_role_permissions
from identity_fanout.membership.record import join_agency, leave_agency
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    USER_ACCESS_CHANGED,
    AgentMembershipChanged,
    Topic,
    UserAccessChangedKafkaEvent,
    decode,
)
from pin_testkit.records import consume
from pin_testkit.seeding import add_permissions, seed_role_with_users

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


def test_every_published_record_is_keyed_by_its_payloads_key_field(  # noqa: PLR0917
    db: Conn,
    operator_db: Conn,
    producer_db: Conn,
    pool: ConnectionPool[Conn],
    worker_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    make_relay: RelayFactory,
) -> None:
    # Access events: a queued fan-out (the worker's page statement) and an inline one.
    queued_role, queued_users = seed_role_with_users(db, users=23)
    enqueue(db, operator_db, queued_role)
    worker, _ = new_worker(worker_dsn, pool, batch_size=10)
    while worker.run_once():
        pass
    inline_role, inline_users = seed_role_with_users(db, users=4)
    add_permissions(db, ["docs.keys"])
    set_role_permissions(operator_db, inline_role, ["docs.keys"], inline_threshold=10)
    # Membership events of a few agents.
    agents = [uuid.uuid4() for _ in range(3)]
    for agent in agents:
        agency = uuid.uuid4()
        join_agency(producer_db, agent, agency)
        leave_agency(producer_db, agent, agency, reason="SelfLeave")
    producer_db.commit()

    # The producers write the catalogue's topics; this test's own topics stand in for them.
    access, membership = kafka_topic(partitions=3), kafka_topic(partitions=3)
    for catalogued, name in ((USER_ACCESS_CHANGED, access), (AGENT_MEMBERSHIP_CHANGED, membership)):
        db.execute(
            "UPDATE identity.outbox SET topic = %s WHERE topic = %s", (name, catalogued.name)
        )
    (rows,) = db.execute("SELECT count(*) FROM identity.outbox").fetchone() or (0,)
    assert rows == len(queued_users) + len(inline_users) + 2 * len(agents)

    relay = make_relay()
    while relay.run_once():
        pass

    checked: dict[str, int] = {}
    for name, topic, payload_type in (
        (access, USER_ACCESS_CHANGED, UserAccessChangedKafkaEvent),
        (membership, AGENT_MEMBERSHIP_CHANGED, AgentMembershipChanged),
    ):
        expected = (
            len(queued_users) + len(inline_users)
            if topic is USER_ACCESS_CHANGED
            else 2 * len(agents)
        )
        for record in consume(kafka_bootstrap, name, expected):
            payload = decode(record.value(), payload_type).payload
            assert record.key() == key_field_text(topic, payload), record.value()
            checked[name] = checked.get(name, 0) + 1
    assert checked == {
        access: len(queued_users) + len(inline_users),
        membership: 2 * len(agents),
    }


def key_field_text(topic: Topic, payload: object) -> bytes:
    """The topic's key field of `payload` (its wire name, from the catalogue) as canonical
    UUID text: lowercase, hyphenated."""
    attribute = {"UserId": "user_id", "AgentUserId": "agent_user_id"}[topic.key_field]
    value = getattr(payload, attribute)
    assert isinstance(value, uuid.UUID)
    return str(value).encode()
