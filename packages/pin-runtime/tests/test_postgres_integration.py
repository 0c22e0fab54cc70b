from __future__ import annotations

import psycopg
import psycopg.sql
import pytest
from psycopg.rows import TupleRow
from psycopg_pool import PoolTimeout

from pin_runtime.postgres import (
    PINNED_SETTINGS,
    LazyConnection,
    SessionLimits,
    connect,
    create_pool,
    is_retriable,
)
from pin_testkit.ports import free_port

pytestmark = pytest.mark.integration


def test_terminated_backend_is_retriable_and_pool_recovers(
    fresh_database: str, postgres_admin_dsn: str
) -> None:
    pool = create_pool(fresh_database, name="rt-test", min_size=2, max_size=2, timeout=10)
    pool.open(wait=True, timeout=10)
    try:
        # Killed while borrowed: the running unit of work sees a retriable error.
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).fetchone()
            assert row == ("rt-test",)
            terminate(postgres_admin_dsn, conn.info.backend_pid)
            with pytest.raises(psycopg.OperationalError) as info:
                conn.execute("SELECT 1")
        assert is_retriable(info.value)

        # Killed while idle in the pool: the checkout check replaces it, unnoticed by callers.
        with pool.connection() as conn:
            idle_pid = conn.info.backend_pid
        terminate(postgres_admin_dsn, idle_pid)
        for _ in range(2):
            with pool.connection() as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
                assert conn.info.backend_pid != idle_pid
    finally:
        pool.close()


def terminate(admin_dsn: str, pid: int) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


def test_terminated_connection_raises_retriable_error(
    fresh_database: str, postgres_admin_dsn: str
) -> None:
    with psycopg.connect(fresh_database) as conn:
        terminate(postgres_admin_dsn, conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError) as info:
            conn.execute("SELECT 1")
    assert is_retriable(info.value)


@pytest.fixture
def one_row(fresh_database: str) -> str:
    """``fresh_database`` with a table ``t`` of one row (id 1, n 0) for two sessions to
    contend for."""
    with psycopg.connect(fresh_database, autocommit=True) as setup:
        setup.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
        setup.execute("INSERT INTO t VALUES (1, 0)")
    return fresh_database


def test_lock_timeout_is_retriable(one_row: str) -> None:
    with psycopg.connect(one_row) as holder, psycopg.connect(one_row) as waiter:
        holder.execute("SELECT * FROM t WHERE id = 1 FOR UPDATE")
        waiter.execute("SET lock_timeout = '50ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable) as info:
            waiter.execute("SELECT * FROM t WHERE id = 1 FOR UPDATE")
    assert is_retriable(info.value)


def test_serialization_failure_is_retriable(one_row: str) -> None:
    with psycopg.connect(one_row) as a, psycopg.connect(one_row) as b:
        for conn in (a, b):
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT n FROM t WHERE id = 1")  # both take their snapshot
        a.execute("UPDATE t SET n = n + 1 WHERE id = 1")
        a.commit()
        with pytest.raises(psycopg.errors.SerializationFailure) as info:
            b.execute("UPDATE t SET n = n + 1 WHERE id = 1")
    assert is_retriable(info.value)


def test_bugs_are_not_retriable(fresh_database: str) -> None:
    with psycopg.connect(fresh_database) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable) as missing:
            conn.execute("SELECT * FROM nowhere")
        conn.rollback()
        with pytest.raises(psycopg.errors.InvalidTextRepresentation) as bad_input:
            conn.execute("SELECT 'abc'::int")
    assert not is_retriable(missing.value)
    assert not is_retriable(bad_input.value)


def test_refused_connection_is_retriable() -> None:
    dsn = f"postgresql://pin@127.0.0.1:{free_port()}/pin"
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(dsn, connect_timeout=2)
    assert is_retriable(refused.value)

    pool = create_pool(dsn, name="rt-refused", timeout=0.5, reconnect_timeout=1)
    pool.open(wait=False)
    try:
        with pytest.raises(PoolTimeout) as timeout, pool.connection():
            pass
        assert is_retriable(timeout.value)
    finally:
        pool.close()


def test_session_limits_apply_to_every_pooled_connection(fresh_database: str) -> None:
    limits = SessionLimits(statement_timeout=1.5, lock_timeout=0.25, idle_in_transaction_timeout=7)
    pool = create_pool(fresh_database, name="limits", min_size=1, max_size=1, session=limits)
    pool.open(wait=True, timeout=10)
    try:
        with pool.connection() as conn:
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                )
            }
    finally:
        pool.close()
    assert shown == {
        "statement_timeout": ("1500ms",),
        "lock_timeout": ("250ms",),
        "idle_in_transaction_session_timeout": ("7s",),
    }


HOSTILE_DEFAULTS = {
    "DateStyle": "SQL, DMY",
    "IntervalStyle": "iso_8601",
    "TimeZone": "Asia/Kathmandu",
    "search_path": "decoy, pg_catalog, public",
    "client_encoding": "LATIN1",
    "extra_float_digits": "-15",
    "bytea_output": "escape",
    "default_transaction_isolation": "serializable",
    "default_transaction_read_only": "on",
    "transform_null_equals": "on",
    "idle_session_timeout": "1ms",
    "statement_timeout": "1ms",
}


def test_a_session_pins_what_its_sql_and_decoding_rely_on_whatever_the_defaults(
    fresh_database: str,
) -> None:
    # The database's defaults and the role's (which outrank the database's) all hostile;
    # the session's options outrank both.
    with psycopg.connect(fresh_database, autocommit=True) as setup:
        database = psycopg.sql.Identifier(str(setup.info.dbname))
        user = psycopg.sql.Identifier(str(setup.info.user))
        setup.execute("CREATE SCHEMA decoy")
        setup.execute(
            "CREATE FUNCTION decoy.now() RETURNS timestamptz LANGUAGE sql"
            " AS $$ SELECT timestamptz '2000-01-01 00:00:00+00' $$"
        )
        for name, value in HOSTILE_DEFAULTS.items():
            for target in (
                psycopg.sql.SQL("DATABASE {}").format(database),
                psycopg.sql.SQL("ROLE {} IN DATABASE {}").format(user, database),
            ):
                setup.execute(
                    psycopg.sql.SQL("ALTER {} SET {} = {}").format(
                        target, psycopg.sql.Identifier(name), psycopg.sql.Literal(value)
                    )
                )
    # (The role's settings in this database go with it when the test drops it.)
    with connect(fresh_database, SessionLimits(statement_timeout=30)) as conn:
        for name, value in PINNED_SETTINGS.items():
            shown = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            assert shown is not None
            assert shown[0].replace(" ", "") == value.replace("\\ ", ""), name
        # What the services' statements read: the real now(), decoded as UTC.
        now, interval = conn.execute("SELECT now(), interval '1 day 02:03:04'").fetchone() or (
            None,
            None,
        )
        assert now is not None
        assert now.year > 2000
        assert interval is not None
        assert interval.days == 1
        with conn.transaction():
            conn.execute("CREATE TEMPORARY TABLE written (v text)")  # not read-only


def test_statement_blocked_by_a_lock_fails_within_lock_timeout(fresh_database: str) -> None:
    with psycopg.connect(fresh_database, autocommit=True) as setup:
        setup.execute("CREATE TABLE public.hot (id int PRIMARY KEY)")
        setup.execute("INSERT INTO public.hot VALUES (1)")
    limits = SessionLimits(lock_timeout=0.3)
    with (
        psycopg.connect(fresh_database) as holder,
        psycopg.connect(fresh_database, **limits.connect_kwargs()) as blocked,
    ):
        holder.execute("SELECT * FROM public.hot WHERE id = 1 FOR UPDATE")
        with pytest.raises(psycopg.errors.LockNotAvailable) as raised:
            # Qualified: a session's search_path is pinned to pg_catalog (PINNED_SETTINGS).
            blocked.execute("UPDATE public.hot SET id = 2 WHERE id = 1")
        assert is_retriable(raised.value)


def test_read_only_transaction_after_failover_is_retriable(fresh_database: str) -> None:
    with psycopg.connect(fresh_database) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as raised:
            conn.execute("CREATE TABLE t (v int)")
    assert raised.value.sqlstate == "25006"
    assert is_retriable(raised.value)


def test_connect_is_autocommit_named_and_bounded(fresh_database: str) -> None:
    limits = SessionLimits(statement_timeout=2, lock_timeout=0.5)
    with connect(fresh_database, limits, application_name="x" * 80) as conn:
        assert conn.autocommit
        row = conn.execute(
            "SELECT application_name, current_setting('statement_timeout'),"
            " current_setting('lock_timeout') FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
    assert row == ("x" * 63, "2s", "500ms")


def test_lazy_connection_reconnects_and_prepares_each_new_session(
    fresh_database: str, postgres_admin_dsn: str
) -> None:
    opened: list[int] = []
    lazy = LazyConnection(
        lambda: connect(fresh_database, SessionLimits()),
        prepare=lambda conn: opened.append(conn.info.backend_pid),
    )
    first = lazy.get()
    first_pid = first.info.backend_pid
    assert lazy.get() is first  # kept while it is healthy
    terminate(postgres_admin_dsn, first_pid)
    with pytest.raises(psycopg.OperationalError):
        first.execute("SELECT 1")
    second = lazy.get()  # the broken one is replaced, prepared like the first
    assert second is not first
    assert second.execute("SELECT 1").fetchone() == (1,)
    assert first.closed
    assert opened == [first_pid, second.info.backend_pid]
    lazy.discard()
    assert second.closed
    lazy.discard()  # nothing held: still no error


def test_lazy_connection_closes_a_session_its_preparation_refused(fresh_database: str) -> None:
    held: list[psycopg.Connection[TupleRow]] = []

    def refuse(conn: psycopg.Connection[TupleRow]) -> None:
        held.append(conn)
        conn.execute("SELECT * FROM no_such_table")

    lazy = LazyConnection(lambda: connect(fresh_database, SessionLimits()), prepare=refuse)
    with pytest.raises(psycopg.errors.UndefinedTable):
        lazy.get()
    assert held[0].closed  # not leaked, and not handed out next time
    with pytest.raises(psycopg.errors.UndefinedTable):
        lazy.get()
    assert len(held) == 2
