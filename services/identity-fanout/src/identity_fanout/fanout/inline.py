"""The inline fan-out's events, built in Python: each user's UserAccessChanged event from
the snapshot rows of the users (`assignments.snapshot_rows`). Pure.

A small role's change (set-role-permissions) builds its few events here; the worker's
batches build the same JSON inside PostgreSQL (`batch`), and
`tests/test_page_writer_integration.py` proves the two agree byte for byte.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC
from uuid import UUID

from identity_fanout.fanout.assignments import AssignmentRow
from pin_contracts import (
    AccessChangeReason,
    ActiveRoleAssignmentSnapshot,
    UserAccessChangedKafkaEvent,
)
from pin_runtime.structs import built_from


def _snapshot(row: AssignmentRow) -> ActiveRoleAssignmentSnapshot:
    expires = row.expires_at
    return built_from(
        ActiveRoleAssignmentSnapshot,
        row,
        expires_at=None if expires is None else expires.replace(tzinfo=UTC),
    )


def _company(
    rows: Sequence[AssignmentRow], role_id: UUID, role_company: UUID | None
) -> UUID | None:
    # The tenant in which the role changed: the user's assignment of that role carries it.
    # Without one (it lapsed between page and snapshot) the role's own tenant stands in.
    for row in rows:
        if row.role_id == role_id and row.company_id is not None:
            return row.company_id
    return role_company


def build_events(
    user_ids: Sequence[UUID],
    rows: Iterable[AssignmentRow],
    *,
    role_id: UUID,
    role_company_id: UUID | None,
    version: int,
    reason: AccessChangeReason = AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
) -> list[UserAccessChangedKafkaEvent]:
    """One event per user of the page, in page order, each with the user's full snapshot.

    Within a user, ``rows`` keep their order (the query sorts by assignment id). A user of the page
    without rows left (every assignment revoked or lapsed meanwhile) still gets an event,
    with an empty snapshot: that is exactly the news that the user lost the access.
    """
    by_user: defaultdict[UUID, list[AssignmentRow]] = defaultdict(list)
    for row in rows:
        by_user[row.user_id].append(row)
    events = []
    for user_id in user_ids:
        user_rows = by_user.get(user_id, [])
        events.append(
            UserAccessChangedKafkaEvent(
                user_id=user_id,
                company_id=_company(user_rows, role_id, role_company_id),
                change_reason=reason,
                active_assignments=tuple(_snapshot(row) for row in user_rows),
                version=version,
            )
        )
    return events
