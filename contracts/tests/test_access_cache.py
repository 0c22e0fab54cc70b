"""The reference consumer of UserAccessChanged: dedup, snapshots, axes, failing closed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pin_contracts import (
    AccessChangeReason,
    ActiveRoleAssignmentSnapshot,
    ContractViolation,
    Envelope,
    ScopeType,
    UserAccessChangedKafkaEvent,
    encode,
    envelope_for,
)
from pin_contracts.access_cache import (
    AccessCache,
    AccessDecision,
    VersionAxis,
    axis_of,
    decide,
)
from pin_contracts.enums import UnknownEnumValue

USER = uuid.UUID("0f0e0d0c-0b0a-4908-8706-050403020100")
AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
FANOUT = AccessChangeReason.ROLE_PERMISSIONS_CHANGED
GRANTED = AccessChangeReason.ROLE_ASSIGNMENT_GRANTED
REVOKED = AccessChangeReason.ROLE_ASSIGNMENT_REVOKED


def assignment(code: str, scope: str = ScopeType.COMPANY) -> ActiveRoleAssignmentSnapshot:
    return ActiveRoleAssignmentSnapshot(
        assignment_id=uuid.uuid4(), role_id=uuid.uuid4(), role_code=code, scope_type=scope
    )


def event(
    version: int,
    reason: str = FANOUT,
    codes: tuple[str, ...] = ("viewer",),
    user: uuid.UUID = USER,
    scope: str = ScopeType.COMPANY,
) -> Envelope[UserAccessChangedKafkaEvent]:
    # Unknown values are built the way a decoder would deliver them (the encoder refuses them).
    return envelope_for(
        UserAccessChangedKafkaEvent(
            user_id=user,
            company_id=None,
            change_reason=reason,
            active_assignments=tuple(assignment(c, scope) for c in codes),
            version=version,
        ),
        occurred_at=AT,
    )


def test_axes_of_the_known_reasons() -> None:
    assert axis_of(FANOUT) is VersionAxis.ROLE
    for reason in (GRANTED, REVOKED, AccessChangeReason.ROLE_ASSIGNMENT_EXPIRED):
        assert axis_of(reason) is VersionAxis.ASSIGNMENT
    assert axis_of(UnknownEnumValue(AccessChangeReason, "RoleMerged")) is None


def test_first_event_fills_the_entry_with_its_snapshot() -> None:
    cache = AccessCache()
    first = event(3, codes=("admin", "viewer"))
    outcome = cache.apply(first)
    assert outcome.decision is AccessDecision.APPLIED
    entry = cache.get(USER)
    assert entry is not None
    assert entry.assignments == first.payload.active_assignments
    assert (entry.axis, entry.version, entry.message_id) == (VersionAxis.ROLE, 3, first.message_id)
    assert entry.role_codes == {"admin", "viewer"}
    assert entry.holds("admin", ScopeType.COMPANY)
    assert not entry.holds("admin", ScopeType.PROJECT)


def test_same_user_and_version_again_is_a_duplicate() -> None:
    cache = AccessCache()
    cache.apply(event(3, codes=("admin",)))
    redelivered = event(3, codes=("other",))  # a new MessageId, same (UserId, Version)
    assert cache.apply(redelivered).decision is AccessDecision.DUPLICATE
    entry = cache.get(USER)
    assert entry is not None
    assert entry.role_codes == {"admin"}


def test_newer_snapshot_replaces_never_merges() -> None:
    cache = AccessCache()
    cache.apply(event(3, codes=("admin", "viewer")))
    assert cache.apply(event(4, codes=("viewer",))).decision is AccessDecision.APPLIED
    entry = cache.get(USER)
    assert entry is not None
    assert entry.role_codes == {"viewer"}


def test_empty_snapshot_means_no_access_left() -> None:
    cache = AccessCache()
    cache.apply(event(3, codes=("admin",)))
    cache.apply(event(4, codes=()))
    entry = cache.get(USER)
    assert entry is not None
    assert entry.assignments == ()
    assert not entry.holds("admin")


def test_lower_version_on_the_same_axis_is_stale() -> None:
    cache = AccessCache()
    cache.apply(event(5, codes=("viewer",)))
    outcome = cache.apply(event(4, codes=("admin",)))
    assert outcome.decision is AccessDecision.STALE
    entry = cache.get(USER)
    assert entry is not None
    assert (entry.version, entry.role_codes) == (5, frozenset({"viewer"}))


def test_point_events_share_one_axis() -> None:
    cache = AccessCache()
    cache.apply(event(7, GRANTED, codes=("admin",)))
    assert cache.apply(event(8, REVOKED, codes=())).decision is AccessDecision.APPLIED
    assert cache.apply(event(8, REVOKED, codes=())).decision is AccessDecision.DUPLICATE
    # A redelivered older pair is below the mark: skipped as stale, just as surely.
    assert cache.apply(event(7, GRANTED, codes=("admin",))).decision is AccessDecision.STALE


def test_an_event_on_the_other_axis_invalidates_the_user() -> None:
    cache = AccessCache()
    cache.apply(event(12, GRANTED, codes=("admin",)))
    outcome = cache.apply(event(3, FANOUT, codes=("admin", "viewer")))
    assert outcome.decision is AccessDecision.INVALIDATED
    assert "cannot be ordered" in outcome.why
    assert cache.get(USER) is None
    assert USER not in cache
    # Marks outlive the invalidation: a redelivery of either event changes nothing ...
    assert cache.apply(event(3, FANOUT)).decision is AccessDecision.DUPLICATE
    assert cache.apply(event(12, GRANTED)).decision is AccessDecision.DUPLICATE
    assert cache.get(USER) is None
    # ... and a newer event fills the entry again.
    assert cache.apply(event(4, FANOUT, codes=("viewer",))).decision is AccessDecision.APPLIED
    entry = cache.get(USER)
    assert entry is not None
    assert entry.role_codes == {"viewer"}


def test_same_number_on_the_other_axis_is_not_a_duplicate() -> None:
    cache = AccessCache()
    cache.apply(event(5, FANOUT))
    assert cache.apply(event(5, GRANTED)).decision is AccessDecision.INVALIDATED


def test_unknown_change_reason_invalidates() -> None:
    cache = AccessCache()
    cache.apply(event(3, codes=("admin",)))
    outcome = cache.apply(event(99, "RoleMerged"))
    assert outcome.decision is AccessDecision.INVALIDATED
    assert "unknown ChangeReason 'RoleMerged'" in outcome.why
    assert cache.get(USER) is None


def test_unknown_scope_type_invalidates_fail_closed() -> None:
    cache = AccessCache()
    cache.apply(event(3, codes=("admin",)))
    outcome = cache.apply(event(4, codes=("admin",), scope="Building"))
    assert outcome.decision is AccessDecision.INVALIDATED
    assert "unknown ScopeType 'Building'" in outcome.why
    assert cache.get(USER) is None
    assert cache.apply(event(4, codes=("admin",), scope="Building")).decision is (
        AccessDecision.DUPLICATE
    )


def test_users_are_independent() -> None:
    cache = AccessCache()
    other = uuid.uuid4()
    cache.apply(event(3))
    cache.apply(event(1, user=other))
    cache.apply(event(9, GRANTED, user=other))  # invalidates `other` only
    assert USER in cache
    assert other not in cache
    assert len(cache) == 1


def test_apply_record_decodes_and_refuses_malformed_bytes() -> None:
    cache = AccessCache()
    assert cache.apply_record(encode(event(2))).decision is AccessDecision.APPLIED
    with pytest.raises(ContractViolation):
        cache.apply_record(b'{"EventType": "UserAccessChanged"}')
    assert len(cache) == 1


def test_explicit_invalidate_keeps_marks() -> None:
    cache = AccessCache()
    cache.apply(event(3))
    cache.invalidate(USER)
    assert cache.get(USER) is None
    assert cache.apply(event(2)).decision is AccessDecision.STALE


def test_decide_is_pure() -> None:
    marks = {VersionAxis.ROLE: 2}
    outcome = decide(None, marks, event(3))
    assert marks == {VersionAxis.ROLE: 2}
    assert outcome.marks == {VersionAxis.ROLE: 3}


# -- properties -----------------------------------------------------------------------------

versions = st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=12)


@given(versions=versions, data=st.data())
def test_any_order_of_same_axis_events_ends_with_the_highest_snapshot(
    versions: list[int], data: st.DataObject
) -> None:
    # Each version's snapshot is distinct (its role code names it); redeliveries repeat it.
    events = [event(v, GRANTED, codes=(f"role-v{v}",)) for v in versions]
    delivered = data.draw(st.permutations(events + data.draw(st.lists(st.sampled_from(events)))))
    cache = AccessCache()
    for e in delivered:
        cache.apply(e)
    entry = cache.get(USER)
    assert entry is not None
    assert entry.version == max(versions)
    assert entry.role_codes == {f"role-v{max(versions)}"}


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from([FANOUT, GRANTED, REVOKED, "RoleMerged"]),
            st.integers(min_value=1, max_value=20),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_a_cached_entry_is_always_the_newest_of_its_axis(steps: list[tuple[str, int]]) -> None:
    """Whatever mix arrives, a kept entry never holds an older snapshot than one seen."""
    cache = AccessCache()
    highest: dict[VersionAxis, int] = {}
    for reason, version in steps:
        e = event(version, reason, codes=(f"{reason}-{version}",))
        outcome = cache.apply(e)
        axis = axis_of(e.payload.parsed_change_reason)
        if axis is not None:
            highest[axis] = max(highest.get(axis, 0), version)
        if axis is None:
            assert outcome.decision is AccessDecision.INVALIDATED
        entry = cache.get(USER)
        if entry is not None:
            assert entry.version == highest[entry.axis]
