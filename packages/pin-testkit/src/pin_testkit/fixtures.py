"""Fixture factories for the fixtures every service's tests declare alike.

A conftest names what differs (`worker_dsn = login_dsn(WORKER, "identity_dsn")`) and the
factory writes the fixture: the attribute name is the fixture's name, as for any fixture.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.rows import TupleRow

from pin_runtime.db_roles import RuntimeRole
from pin_runtime.logging import JsonFormatter

__all__ = ["connection", "json_logs", "login_dsn"]


def login_dsn(role: RuntimeRole, database: str) -> Callable[..., str]:
    """A fixture: the DSN of fixture `database` as the login user of `role`'s group.

    The code under test connects with it, so a statement the migrations did not grant to
    `role` fails with SQLSTATE 42501 instead of passing as the database's owner."""

    def dsn(request: pytest.FixtureRequest, runtime_dsn: Callable[[str, str], str]) -> str:
        return runtime_dsn(request.getfixturevalue(database), role.name)

    dsn.__doc__ = f"The DSN of `{database}` as the login of {role.name} ({role.purpose})."
    return pytest.fixture(dsn)


def connection(dsn: str) -> Callable[..., Iterator[psycopg.Connection[TupleRow]]]:
    """A fixture: an autocommit connection with the DSN of fixture `dsn`, for a test's setup
    and checks (closed after the test)."""

    def connected(request: pytest.FixtureRequest) -> Iterator[psycopg.Connection[TupleRow]]:
        with psycopg.connect(request.getfixturevalue(dsn), autocommit=True) as conn:
            yield conn

    connected.__doc__ = f"An autocommit connection with `{dsn}` (setup and checks)."
    return pytest.fixture(connected)


def json_logs(logger: str, service: str) -> Callable[..., Iterator[io.StringIO]]:
    """A fixture: the lines of `logger` (INFO and up) as the JSON a log pipeline receives
    from `service`, in a stream the test reads."""

    def capture() -> Iterator[io.StringIO]:
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter(service=service))
        target = logging.getLogger(logger)
        target.addHandler(handler)
        previous = target.level
        target.setLevel(logging.INFO)
        yield stream
        target.removeHandler(handler)
        target.setLevel(previous)

    capture.__doc__ = f"The {service} log lines (INFO and up) as JSON, in a stream."
    return pytest.fixture(capture)
