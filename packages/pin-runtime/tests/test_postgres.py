from __future__ import annotations

import psycopg
import psycopg.errors as pe
import pytest
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout, TooManyRequests

from pin_runtime.errors import MigrationError
from pin_runtime.postgres import (
    DatabaseAuthError,
    auth_failure,
    causes,
    create_pool,
    is_retriable,
    login_of,
)

RETRIABLE: list[BaseException] = [
    psycopg.OperationalError("connection refused"),  # client side, no SQLSTATE
    pe.ConnectionTimeout("connection timeout expired"),
    pe.AdminShutdown(),  # 57P01
    pe.CrashShutdown(),  # 57P02
    pe.CannotConnectNow(),  # 57P03
    pe.QueryCanceled(),  # 57014, statement_timeout
    pe.SerializationFailure(),  # 40001
    pe.DeadlockDetected(),  # 40P01
    pe.LockNotAvailable(),  # 55P03
    pe.TooManyConnections(),  # 53300
    pe.DiskFull(),  # 53100
    pe.ConnectionFailure(),  # 08006
    pe.SqlclientUnableToEstablishSqlconnection(),  # 08001
    pe.IoError(),  # 58030
    pe.IdleInTransactionSessionTimeout(),  # 25P03
    PoolTimeout("couldn't get a connection after 30.00 sec"),
    TooManyRequests("the pool has already 10 requests waiting"),
    ConnectionResetError(),
]

BUGS: list[BaseException] = [
    pe.UndefinedTable(),  # 42P01
    pe.SyntaxError(),  # 42601
    pe.UniqueViolation(),  # 23505
    pe.ForeignKeyViolation(),  # 23503
    pe.InvalidTextRepresentation(),  # 22P02
    pe.NumericValueOutOfRange(),  # 22003
    pe.ProgramLimitExceeded(),  # 54000, an OperationalError subclass that is still a bug
    pe.InternalError_(),  # XX000
    pe.InsufficientPrivilege(),  # 42501
    psycopg.InterfaceError("the cursor is closed"),
    psycopg.ProgrammingError("the query has 2 placeholders but 1 parameters were passed"),
    PoolClosed("the pool 'x' is already closed"),
    ValueError("not a database error"),
    KeyboardInterrupt(),
]


@pytest.mark.parametrize("exc", RETRIABLE, ids=lambda e: type(e).__name__)
def test_retriable(exc: BaseException) -> None:
    assert is_retriable(exc)


@pytest.mark.parametrize("exc", BUGS, ids=lambda e: type(e).__name__)
def test_not_retriable(exc: BaseException) -> None:
    assert not is_retriable(exc)


def test_follows_explicit_cause() -> None:
    outer = MigrationError("wrapped")
    outer.__cause__ = pe.SerializationFailure()
    assert is_retriable(outer)


def test_ignores_implicit_context() -> None:
    # A bug raised while handling an outage is still a bug.
    exc = ValueError("bug while handling")
    exc.__context__ = pe.AdminShutdown()
    assert not is_retriable(exc)


def test_cause_cycle_terminates() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_retriable(a)


def test_create_pool_is_closed_and_configured() -> None:
    pool = create_pool(
        "postgresql://pin@127.0.0.1:1/pin", name="identity-fanout", min_size=2, max_size=8
    )
    assert isinstance(pool, ConnectionPool)
    assert pool.closed  # no I/O until the caller opens it
    assert isinstance(pool.kwargs, dict)
    assert (pool.name, pool.min_size, pool.max_size, pool.timeout) == (
        "identity-fanout",
        2,
        8,
        30.0,
    )
    assert pool.kwargs["application_name"] == "identity-fanout"
    assert pool.kwargs["connect_timeout"] == 5
    assert pool._check is ConnectionPool.check_connection


def test_create_pool_overrides() -> None:
    pool = create_pool(
        "",
        name="rewards",
        application_name="rewards-membership",
        connect_kwargs={"options": "-c statement_timeout=5000"},
    )
    assert isinstance(pool.kwargs, dict)
    assert pool.kwargs["application_name"] == "rewards-membership"
    assert pool.kwargs["options"] == "-c statement_timeout=5000"


@pytest.mark.parametrize(
    ("min_size", "max_size", "timeout"), [(-1, 4, 1.0), (5, 4, 1.0), (0, 0, 1.0), (1, 4, 0.0)]
)
def test_create_pool_validates(min_size: int, max_size: int, timeout: float) -> None:
    with pytest.raises(ValueError, match=r"must be|need"):
        create_pool("", name="x", min_size=min_size, max_size=max_size, timeout=timeout)


def test_causes_walks_the_raise_from_chain_once_even_in_a_cycle() -> None:
    inner = pe.AdminShutdown()
    middle = RuntimeError("wrapped")
    middle.__cause__ = inner
    outer = ValueError("outer")
    outer.__cause__ = middle
    inner.__cause__ = outer  # a cycle: the walk must still end
    assert list(causes(outer)) == [outer, middle, inner]
    assert is_retriable(outer)


@pytest.mark.parametrize(
    ("message", "sqlstate"),
    [
        (
            'connection failed: connection to server at "10.0.0.5", port 5432 failed: '
            'FATAL:  password authentication failed for user "relay"',
            "28P01",
        ),
        ("connection failed: fe_sendauth: no password supplied", "28P01"),
        ('connection failed: FATAL:  role "gone" does not exist', "28000"),
        (
            'connection failed: FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "relay"',
            "28000",
        ),
        ('connection failed: FATAL:  role "relay" is not permitted to log in', "28000"),
    ],
)
def test_a_refused_login_is_told_apart_and_stays_retriable(message: str, sqlstate: str) -> None:
    # libpq gives a refused connect no SQLSTATE: the server's FATAL line tells it.
    exc = psycopg.OperationalError(message)
    assert auth_failure(exc) == sqlstate
    assert auth_failure(RuntimeError("wrapped")) is None
    wrapped = RuntimeError("round failed")
    wrapped.__cause__ = exc
    assert auth_failure(wrapped) == sqlstate
    # A rewritten passfile or a restored password heals it without a restart.
    assert is_retriable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.OperationalError('FATAL:  database "x" does not exist'),
        pe.QueryCanceled(),
        pe.InsufficientPrivilege(),
    ],
)
def test_other_failures_are_no_refused_login(exc: BaseException) -> None:
    assert auth_failure(exc) is None


def test_a_refused_login_names_user_and_host_never_the_password() -> None:
    dsn = "host=db.internal port=6432 user=relay password=s3cret dbname=pin passfile=/x"
    assert login_of(dsn) == ("relay", "db.internal:6432")
    refused = DatabaseAuthError(*login_of(dsn), "28P01")
    assert str(refused) == (
        "the database refused the login of user relay at db.internal:6432 (28P01 invalid_password)"
    )
    assert "s3cret" not in str(refused)
