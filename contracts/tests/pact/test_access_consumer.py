"""Consumer pact: what the consumers of pin.identity.access.v1 need from identity.

The consumer is the reference one, ``pin_contracts.access_cache`` (what crm, catalog,
chessboard and the gateway reuse): each example record is decoded and applied to an
``AccessCache`` as a Kafka record would be. The pact is written to
``contracts/pacts/pin-access-cache-identity-fanout.json`` and replayed by identity's
provider verification against its real fan-out. No service is needed.

What the cache relies on, and so what the matchers pin: UserId (= the record key) and
Version for dedup, ChangeReason exactly (it picks the Version axis), and per assignment
AssignmentId, RoleId, RoleCode and a ScopeType it knows. The optional Scope*Id and
ExpiresAt are left out: a producer may send them, the cache does not depend on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pact import Pact, match

from pin_contracts import EVENT_TYPE_HEADER, USER_ACCESS_CHANGED, ScopeType
from pin_contracts.access_cache import AccessCache, AccessDecision, Decision, VersionAxis
from pin_testkit.message_pacts import (
    envelope,
    examples,
    pact_fixture,
    record_metadata,
    record_value,
    uuid_like,
)

PACT_DIR = Path(__file__).resolve().parents[2] / "pacts"
CONSUMER = "pin-access-cache"
PROVIDER = "identity-fanout"

SCOPE_TYPES = "^(" + "|".join(s.value for s in ScopeType) + ")$"

USER = "0f0e0d0c-0b0a-4908-8706-050403020100"

SNAPSHOT = "a UserAccessChanged after a role's permissions changed: the user's full snapshot"
EMPTY = "a UserAccessChanged with an empty snapshot: the user holds no active assignment"


def access_changed(assignments: object, version: int) -> dict[str, object]:
    return envelope(
        message_id="0d15ea5e-0000-4000-8000-000000000002",
        event_type="UserAccessChanged",
        aggregate_type="User",
        aggregate_id=USER,
        version=version,
        correlation_id="job-run-42",
        payload={
            "UserId": uuid_like(USER),
            "ChangeReason": "RolePermissionsChanged",
            "ActiveAssignments": assignments,
            "Version": match.int(version),
        },
    )


ASSIGNMENT: dict[str, object] = {
    "AssignmentId": uuid_like("a5519000-0000-4000-8000-000000000001"),
    "RoleId": uuid_like("201e0000-0000-4000-8000-000000000001"),
    "RoleCode": match.str("project-viewer"),
    "ScopeType": match.regex("Company", regex=SCOPE_TYPES),
}

# The record key is UserId: per-user order.
RECORD_METADATA = record_metadata(USER, "UserAccessChanged")


def access_pact() -> Pact:
    pact = Pact(CONSUMER, PROVIDER).with_specification("V4")
    (
        pact.upon_receiving(SNAPSHOT, "Async")
        .given("a user holds two roles and one of them changes its permissions")
        .with_body(
            access_changed(match.each_like(ASSIGNMENT, min=1), version=2), "application/json"
        )
        .with_metadata(RECORD_METADATA)
    )
    (
        pact.upon_receiving(EMPTY, "Async")
        .given("a user's only assignment of a role lapsed and the role changes its permissions")
        # An empty array, not a matcher: the news is exactly that nothing is left.
        .with_body(access_changed([], version=2), "application/json")
        .with_metadata(RECORD_METADATA)
    )
    return pact


pact = pact_fixture(access_pact)


def consume(cache: AccessCache, value: bytes, metadata: dict[str, Any]) -> Decision:
    """What a consumer does with one record: check the record layout, apply the value."""
    outcome = cache.apply_record(value)
    assert metadata["key"] == str(outcome.user_id)
    assert metadata[EVENT_TYPE_HEADER] == USER_ACCESS_CHANGED.event_type
    return outcome


def test_snapshot_fills_the_cache_and_a_redelivery_is_ignored(pact: Pact) -> None:
    value, metadata = examples(pact)[SNAPSHOT]
    cache = AccessCache()
    outcome = consume(cache, value, metadata)
    assert outcome.decision is AccessDecision.APPLIED
    entry = cache.get(outcome.user_id)
    assert entry is not None
    assert entry.axis is VersionAxis.ROLE
    assert entry.role_codes == {"project-viewer"}
    assert entry.holds("project-viewer", ScopeType.COMPANY)
    # At-least-once: the same (UserId, Version) again changes nothing.
    assert consume(cache, value, metadata).decision is AccessDecision.DUPLICATE


def test_empty_snapshot_replaces_what_was_cached(pact: Pact) -> None:
    found = examples(pact)
    cache = AccessCache()
    snapshot_value, metadata = found[SNAPSHOT]
    user = consume(cache, snapshot_value, metadata).user_id
    # The same user one role version later, with nothing left.
    empty_value, empty_metadata = found[EMPTY]
    later = json.loads(empty_value)
    later["Version"] = later["Payload"]["Version"] = 3
    outcome = consume(cache, json.dumps(later).encode(), empty_metadata)
    assert (outcome.decision, outcome.user_id) == (AccessDecision.APPLIED, user)
    entry = cache.get(user)
    assert entry is not None
    assert entry.assignments == ()
    assert not entry.holds("project-viewer")


def test_every_example_is_applied_and_the_pact_is_written(pact: Pact) -> None:
    decisions: list[AccessDecision] = []

    def handler(body: str | bytes | None, metadata: dict[str, object]) -> None:
        decisions.append(consume(AccessCache(), record_value(body), dict(metadata)).decision)

    pact.verify(handler, "Async")
    assert decisions == [AccessDecision.APPLIED, AccessDecision.APPLIED]
    pact.write_file(PACT_DIR, overwrite=True)
    written = json.loads((PACT_DIR / f"{CONSUMER}-{PROVIDER}.json").read_text())
    assert sorted(i["description"] for i in written["interactions"]) == sorted([SNAPSHOT, EMPTY])
