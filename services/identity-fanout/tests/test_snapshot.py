"""Building events from snapshot rows: pure, no database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from identity_fanout.fanout.assignments import AssignmentRow
from identity_fanout.fanout.inline import build_events
from pin_contracts import AccessChangeReason, ScopeType

ROLE = uuid.uuid4()
OTHER = uuid.uuid4()
COMPANY = uuid.uuid4()


def row(user: uuid.UUID, role: uuid.UUID, code: str, **kw: object) -> AssignmentRow:
    values: dict[str, object] = {
        "user_id": user,
        "assignment_id": uuid.uuid4(),
        "role_id": role,
        "role_code": code,
        "company_id": COMPANY,
        "scope_type": ScopeType.COMPANY.value,
        "scope_organization_id": None,
        "scope_project_group_id": None,
        "scope_project_id": None,
        "expires_at": None,
    }
    values.update(kw)
    return AssignmentRow(**values)  # type: ignore[arg-type]


def test_every_user_of_the_page_gets_one_event_with_all_assignments() -> None:
    a, b = sorted([uuid.uuid4(), uuid.uuid4()])
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    # The query reads ExpiresAt in UTC without a zone; the event carries it as UTC.
    rows = [
        row(a, ROLE, "big"),
        row(
            a,
            OTHER,
            "other",
            scope_type="Project",
            scope_project_id=a,
            expires_at=expires.replace(tzinfo=None),
        ),
        row(b, ROLE, "big"),
    ]

    events = build_events([a, b], rows, role_id=ROLE, role_company_id=COMPANY, version=9)

    assert [e.user_id for e in events] == [a, b]
    assert all(e.version == 9 for e in events)
    assert all(e.change_reason == AccessChangeReason.ROLE_PERMISSIONS_CHANGED for e in events)
    assert [s.role_code for s in events[0].active_assignments] == ["big", "other"]
    other = events[0].active_assignments[1]
    assert (other.scope_type, other.scope_project_id, other.expires_at) == ("Project", a, expires)
    assert [s.role_code for s in events[1].active_assignments] == ["big"]


def test_rows_out_of_user_order_still_group_by_user() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    rows = [row(a, ROLE, "x"), row(b, ROLE, "x"), row(a, OTHER, "y")]
    events = build_events([a, b], rows, role_id=ROLE, role_company_id=None, version=1)
    assert [len(e.active_assignments) for e in events] == [2, 1]


def test_user_left_without_assignments_gets_an_empty_snapshot() -> None:
    # Revoked between page and snapshot: the event that says "no access" must still go out.
    gone = uuid.uuid4()
    events = build_events([gone], [], role_id=ROLE, role_company_id=COMPANY, version=3)
    assert events[0].active_assignments == ()
    assert events[0].company_id == COMPANY


def test_company_is_the_tenant_of_the_changed_role_assignment() -> None:
    user = uuid.uuid4()
    tenant = uuid.uuid4()
    rows = [row(user, OTHER, "o", company_id=uuid.uuid4()), row(user, ROLE, "r", company_id=tenant)]
    [event] = build_events([user], rows, role_id=ROLE, role_company_id=None, version=2)
    assert event.company_id == tenant
