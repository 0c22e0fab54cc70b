"""Fixtures of the identity-fanout tests: a migrated `identity` database per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.rows import TupleRow

from identity_fanout.schema import migrate_database


@pytest.fixture
def identity_dsn(make_database: Callable[[str, Callable[[str], object]], str]) -> str:
    """DSN of a fresh clone of a migrated identity database."""
    return make_database("identity", migrate_database)


@pytest.fixture
def db(identity_dsn: str) -> Iterator[psycopg.Connection[TupleRow]]:
    """An autocommit connection to the test's identity database (for setup and checks)."""
    with psycopg.connect(identity_dsn, autocommit=True) as conn:
        yield conn
