"""A database password kept in a file (`<PREFIX>DATABASE_PASSWORD_FILE`): read at every connect
by the pool and by a loop's `LazyConnection`, so a rotation needs no restart, whatever the
file's mode. On a real PostgreSQL that checks the passwords of `pin_password_auth`'s members
(pin-local's pg_hba.conf rule)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.sql
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pin_runtime.postgres import (
    LazyConnection,
    SessionLimits,
    auth_failure,
    connect,
    create_pool,
    is_retriable,
    read_password_from,
)
from pin_testkit.local.postgres import PASSWORD_GROUP
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

PASSWORD = "first-Secret-1"
ROTATED = "second-Secret-2"
GROUP_READABLE = 0o640
"""What a Secret volume's file is under a pod's fsGroup: libpq's own passfile refuses it."""


class Role:
    """A login of `PASSWORD_GROUP` (its password checked) on a fresh database."""

    def __init__(self, admin_dsn: str, database_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.name = f"pin_test_pwfile_{uuid.uuid4().hex[:10]}"
        options = {k: v for k, v in conninfo_to_dict(database_dsn).items() if k != "password"}
        self.dsn = make_conninfo("", **{**options, "user": self.name})

    def admin(self, statement: str, password: str | None = None) -> None:
        query = psycopg.sql.SQL(statement).format(
            name=psycopg.sql.Identifier(self.name),
            group=psycopg.sql.Identifier(PASSWORD_GROUP),
            password=psycopg.sql.Literal(password),
        )
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(query)

    def kill_sessions(self) -> int:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = %s",
                (self.name,),
            ).fetchall()
        return sum(1 for (killed,) in rows if killed)


@pytest.fixture
def role(postgres_admin_dsn: str, fresh_database: str) -> Iterator[Role]:
    made = Role(postgres_admin_dsn, fresh_database)
    made.admin("CREATE ROLE {name} LOGIN PASSWORD {password} IN ROLE {group}", PASSWORD)
    yield made
    read_password_from(made.dsn, None)
    made.kill_sessions()
    made.admin("DROP ROLE {name}")


def write_password(path: Path, password: str) -> None:
    path.write_text(password + "\n")
    path.chmod(GROUP_READABLE)


def test_pool_and_lazy_connection_take_a_rewritten_password_file_at_their_next_connect(
    role: Role, tmp_path: Path
) -> None:
    secret = tmp_path / "password"
    write_password(secret, PASSWORD)
    # The DSN names no password: without the file registered the server refuses it.
    with pytest.raises(psycopg.OperationalError) as refused:
        connect(role.dsn, SessionLimits())
    assert auth_failure(refused.value) == "28P01"
    read_password_from(role.dsn, str(secret))

    pool = create_pool(role.dsn, name="pwfile-test", min_size=2, max_size=2, timeout=10)
    pool.open(wait=True, timeout=10)
    lazy = LazyConnection(lambda: connect(role.dsn, SessionLimits()))
    try:
        with pool.connection() as conn:
            assert conn.execute("SELECT current_user").fetchone() == (role.name,)
        first_pid = lazy.get().info.backend_pid

        # The password rotates on the server and the sessions are ended: until the file is
        # rewritten, a new session is refused as a refused login (retriable, told apart).
        role.admin("ALTER ROLE {name} PASSWORD {password}", ROTATED)
        assert role.kill_sessions() >= 3  # both pooled sessions and the lazy one
        with pytest.raises(psycopg.OperationalError) as stale:
            connect(role.dsn, SessionLimits())
        assert auth_failure(stale.value) == "28P01"
        assert is_retriable(stale.value)

        write_password(secret, ROTATED)

        def pool_answers() -> bool:
            try:
                with pool.connection(timeout=2) as conn:
                    return conn.execute("SELECT current_user").fetchone() == (role.name,)
            except psycopg.OperationalError:  # PoolTimeout too: its sessions not back yet
                return False

        def lazy_answers() -> bool:
            try:
                return lazy.get().execute("SELECT current_user").fetchone() == (role.name,)
            except psycopg.OperationalError:
                lazy.discard()  # as a loop does after a failed unit of work
                return False

        wait_until(pool_answers, 30, "the pool logs in with the rewritten file")
        wait_until(lazy_answers, 30, "the lazy connection logs in with the rewritten file")
        assert lazy.get().info.backend_pid != first_pid
    finally:
        lazy.close()
        pool.close()


def test_a_password_file_that_cannot_be_read_fails_the_connect_as_an_outage(
    tmp_path: Path,
) -> None:
    # Read before any network I/O: no server is needed to see it.
    dsn = "host=127.0.0.1 port=1 user=nobody dbname=none"
    missing = tmp_path / "gone"
    read_password_from(dsn, str(missing))
    try:
        with pytest.raises(psycopg.OperationalError) as info:
            connect(dsn, SessionLimits())
        assert str(info.value).startswith("database password file: cannot read ")
        assert str(missing) in str(info.value)
        assert is_retriable(info.value)
    finally:
        read_password_from(dsn, None)
