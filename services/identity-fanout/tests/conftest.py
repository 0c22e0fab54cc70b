"""Fixtures of the identity-fanout tests: a migrated `identity` database per test.

The database is migrated as its owner; `db` and `identity_dsn` (the owner) set up and check
state. The code under test connects as its process's runtime role (`worker_dsn`,
`relay_dsn`, `producer_dsn`, `operator_dsn`, and the `*_db` connections), so a statement
the migrations did not grant to that role fails the test with SQLSTATE 42501.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from relay_support import RELAY_TEST_OPTIONS, RelayFactory, new_relay

from identity_fanout.db_roles import OPERATOR, PRODUCER, RELAY, WORKER
from identity_fanout.outbox.relay import OutboxRelay
from identity_fanout.schema import migrate_database
from pin_testkit import fixtures
from pin_testkit.fixtures import connection, login_dsn


@pytest.fixture
def identity_dsn(make_database: Callable[[str, Callable[[str], object]], str]) -> str:
    """DSN of a fresh clone of a migrated identity database (as its owner)."""
    return make_database("identity", migrate_database)


# The owner's connection, then each process's login and its connection.
db = connection("identity_dsn")
worker_dsn = login_dsn(WORKER, "identity_dsn")
relay_dsn = login_dsn(RELAY, "identity_dsn")
producer_dsn = login_dsn(PRODUCER, "identity_dsn")
operator_dsn = login_dsn(OPERATOR, "identity_dsn")
worker_db = connection("worker_dsn")
producer_db = connection("producer_dsn")
operator_db = connection("operator_dsn")


@pytest.fixture
def pool(worker_dsn: str) -> Iterator[ConnectionPool[psycopg.Connection[TupleRow]]]:
    """The fan-out worker's pool, as its runtime role (room for a few workers at once)."""
    with ConnectionPool(worker_dsn, min_size=1, max_size=6, open=True) as p:
        yield p


@pytest.fixture
def make_relay(relay_dsn: str, kafka_bootstrap: str) -> Iterator[RelayFactory]:
    """``make_relay(**overrides)``: relays on the session broker, logged in as the relay's
    runtime role, with the tests' short timeouts (``RELAY_TEST_OPTIONS``); closed after."""
    relays: list[OutboxRelay] = []

    def make(**overrides: Any) -> OutboxRelay:
        options = RELAY_TEST_OPTIONS | overrides
        relay = new_relay(
            options.pop("dsn", relay_dsn), options.pop("bootstrap", kafka_bootstrap), **options
        )
        relays.append(relay)
        return relay

    yield make
    for relay in relays:
        relay.close()


json_logs = fixtures.json_logs("identity_fanout", "identity-fanout")
