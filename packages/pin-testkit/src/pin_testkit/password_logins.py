"""A test's own login that must give its password: a member of `PASSWORD_GROUP` (pin-local's
pg_hba.conf checks the passwords of its members; every other role is trusted on loopback)
and of a runtime role's group, so it can stand in for that role and have its password
rotated under a running process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pin_testkit.local.postgres import PASSWORD_GROUP

__all__ = ["PasswordLogin", "password_login"]


class PasswordLogin:
    """A login of `like_dsn`'s role's group that must give its password."""

    def __init__(self, admin_dsn: str, like_dsn: str, name: str) -> None:
        self.admin_dsn = admin_dsn
        self.name = name
        base = {k: v for k, v in conninfo_to_dict(like_dsn).items() if k != "password"}
        self.base = make_conninfo("", **{**base, "user": name})

    def dsn(self, **options: str) -> str:
        return make_conninfo(self.base, **options)

    def rotate(self, password: str) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(self.name), sql.Literal(password)
                )
            )

    def sessions(self) -> int:
        """Sessions of this login open now."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (self.name,)
            ).fetchone()
        return int(row[0]) if row else 0

    def kill_sessions(self) -> int:
        """pg_terminate_backend of every session of this login; how many."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (self.name,),
            ).fetchall()
        return sum(1 for (killed,) in rows if killed)


@contextmanager
def password_login(admin_dsn: str, like_dsn: str, password: str) -> Iterator[PasswordLogin]:
    """A new login with `password`, in the groups of `like_dsn`'s user and `PASSWORD_GROUP`;
    its sessions ended and the role dropped on the way out."""
    name = f"pin_test_pw_{uuid.uuid4().hex[:10]}"
    runtime_user = conninfo_to_dict(like_dsn)["user"]
    made = PasswordLogin(admin_dsn, like_dsn, name)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        group = admin.execute(
            "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid"
            " JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = %s",
            (runtime_user,),
        ).fetchone()
        if group is None:
            raise LookupError(f"{runtime_user} is in no group")
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}, {}").format(
                sql.Identifier(name),
                sql.Literal(password),
                sql.Identifier(PASSWORD_GROUP),
                sql.Identifier(group[0]),
            )
        )
    try:
        yield made
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
