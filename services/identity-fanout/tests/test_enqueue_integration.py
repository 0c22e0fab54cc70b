"""set-role-permissions: bad input is refused before anything is written."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.rows import TupleRow

from identity_fanout.errors import RoleArchivedError, RoleNotFoundError, UnknownPermissionError
from identity_fanout.fanout.enqueue import set_role_permissions
from pin_testkit.seeding import add_permissions, add_role, seed_role_with_users

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


def state(db: Conn, role: uuid.UUID) -> tuple[object, ...]:
    row = db.execute(
        "SELECT r.version, "
        "(SELECT array_agg(permission_code ORDER BY permission_code) "
        " FROM identity.role_permissions WHERE role_id = r.id), "
        "(SELECT count(*) FROM identity.outbox), "
        "(SELECT count(*) FROM identity.access_fanout_tasks) "
        "FROM identity.role_definitions r WHERE r.id = %s",
        (role,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_unknown_role_is_refused(db: Conn, operator_db: Conn) -> None:
    missing = uuid.uuid4()
    with pytest.raises(RoleNotFoundError, match=str(missing)):
        set_role_permissions(operator_db, missing, [], inline_threshold=10)


def test_archived_role_is_refused_and_unchanged(db: Conn, operator_db: Conn) -> None:
    role = add_role(db, "old", permissions=["a.read"], status="Archived")
    before = state(db, role)
    with pytest.raises(RoleArchivedError):
        set_role_permissions(operator_db, role, ["a.read", "a.write"], inline_threshold=10)
    assert state(db, role) == before


def test_unknown_permission_codes_are_named_and_nothing_is_written(
    db: Conn, operator_db: Conn
) -> None:
    role, _ = seed_role_with_users(db, users=3)
    add_permissions(db, ["known.read"])
    before = state(db, role)
    with pytest.raises(UnknownPermissionError) as info:
        set_role_permissions(
            operator_db, role, ["known.read", "nope.b", "nope.a"], inline_threshold=10
        )
    assert info.value.codes == ["nope.a", "nope.b"]
    assert state(db, role) == before


def test_identical_permission_set_changes_nothing(db: Conn, operator_db: Conn) -> None:
    role = add_role(db, "same", permissions=["x.read", "x.write"])
    before = state(db, role)
    change = set_role_permissions(
        operator_db, role, ["x.write", "x.read", "x.read"], inline_threshold=10
    )
    assert (change.mode, change.version) == ("unchanged", 1)
    assert state(db, role) == before


def test_permissions_are_replaced_and_version_bumped_once(db: Conn, operator_db: Conn) -> None:
    role = add_role(db, "grow", permissions=["g.read", "g.old"])
    add_permissions(db, ["g.write"])
    change = set_role_permissions(operator_db, role, ["g.read", "g.write"], inline_threshold=10)
    assert (change.mode, change.version, change.users) == ("inline", 2, 0)
    assert state(db, role) == (2, ["g.read", "g.write"], 0, 0)
