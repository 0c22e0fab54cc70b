"""Consumer pact: what rewards-membership needs from identity's AgentMembershipChanged.

Each example message goes through the consumer's real decision path (validation, version
guard, row transition, batch plan) exactly as a record value from Kafka would. The pact is
written to ``contracts/pacts/rewards-membership-identity-fanout.json``, which identity's
provider verification replays against its real producer. No service is needed.

Matchers say what the consumer relies on: UUIDs and RFC 3339 timestamps by format, numbers
by type, the enum values and constant metadata exactly. Reason and EffectiveAt are absent
from the "without Reason" example: the consumer must cope with a producer older than
ADR-0072, and a producer that sends them still satisfies it.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pact import Pact, match

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    EVENT_TYPE_HEADER,
    AgentMembershipStatus,
    LeaveReason,
)
from pin_testkit.message_pacts import (
    envelope,
    examples,
    moment,
    pact_fixture,
    record_metadata,
    record_value,
    uuid_like,
)
from rewards_membership.rules.guard import MembershipRow
from rewards_membership.rules.plan import Outcome, plan_batch
from rewards_membership.rules.validation import MembershipChange, validate

PACT_DIR = Path(__file__).resolve().parents[3] / "contracts" / "pacts"
CONSUMER = "rewards-membership"
PROVIDER = "identity-fanout"

LEAVE_REASONS = r"^(SelfLeave|ExcludedByAgency)$"

AGENT = "a1b2c3d4-e5f6-4789-8abc-def012345678"
AGENCY = "c0ffee00-0000-4000-8000-00000000a9e1"
MEMBERSHIP = "5eed0000-0000-4000-8000-0000000000aa"
INVITATION = "1a1a1a1a-0000-4000-8000-000000000001"

ACTIVE = "an AgentMembershipChanged Active: an agent joined an agency"
LEFT_WITH_REASON = "an AgentMembershipChanged Left with Reason and EffectiveAt"
LEFT_WITHOUT_REASON = "an AgentMembershipChanged Left without Reason (a producer before ADR-0072)"


def membership_changed(payload: dict[str, object], version: int) -> dict[str, object]:
    return envelope(
        message_id="0d15ea5e-0000-4000-8000-000000000001",
        event_type="AgentMembershipChanged",
        aggregate_type="AgentMembership",
        aggregate_id=MEMBERSHIP,
        version=version,
        correlation_id="operation-42",
        payload=payload,
    )


def membership(status: str, version: int, **extra: object) -> dict[str, object]:
    return {
        "MembershipId": uuid_like(MEMBERSHIP),
        "AgentUserId": uuid_like(AGENT),
        "CompanyId": uuid_like(AGENCY),
        "Status": status,
        "Version": match.int(version),
        "JoinedAt": moment("2024-06-01T09:00:00Z"),
        "InvitationId": uuid_like(INVITATION),
        **extra,
    }


# The record key is AgentUserId: it keeps join/leave of one agent in order.
RECORD_METADATA = record_metadata(AGENT, "AgentMembershipChanged")


def membership_pact() -> Pact:
    pact = Pact(CONSUMER, PROVIDER).with_specification("V4")
    for description, state, body in (
        (
            ACTIVE,
            "an agent accepted an invitation to an agency",
            membership_changed(membership("Active", 1, LeftAt=None), 1),
        ),
        (
            LEFT_WITH_REASON,
            "an agent is Active in an agency and is excluded with a deferred EffectiveAt",
            membership_changed(
                membership(
                    "Left",
                    2,
                    Reason=match.regex("ExcludedByAgency", regex=LEAVE_REASONS),
                    EffectiveAt=moment("2025-03-31T00:00:00+03:00"),
                    LeftAt=moment("2025-03-01T09:00:00.123456Z"),
                ),
                2,
            ),
        ),
        (
            LEFT_WITHOUT_REASON,
            "an agent is Active in an agency and leaves it",
            membership_changed(membership("Left", 2, LeftAt=moment("2025-03-01T09:00:00Z")), 2),
        ),
    ):
        (
            pact.upon_receiving(description, "Async")
            .given(state)
            .with_body(body, "application/json")
            .with_metadata(RECORD_METADATA)
        )
    return pact


pact = pact_fixture(membership_pact)


def handle(value: bytes, metadata: dict[str, Any]) -> tuple[MembershipChange, MembershipRow]:
    """The consumer's decision for one record, against a row that held Version 1 before."""
    change = validate(value)
    assert isinstance(change, MembershipChange), change
    assert metadata["key"] == str(change.payload.agent_user_id)
    assert metadata[EVENT_TYPE_HEADER] == AGENT_MEMBERSHIP_CHANGED.event_type
    existing = MembershipRow(
        agent_user_id=change.payload.agent_user_id,
        company_id=change.payload.company_id,
        membership_status=AgentMembershipStatus.LEFT.value,
        last_membership_version=0,
        version=3,
    )
    plan = plan_batch([change], frozenset(), {change.row_key: existing})
    assert plan.outcomes == [Outcome.APPLIED]
    [row] = plan.updates
    assert plan.inbox == [(change.key, Outcome.APPLIED)]
    return change, row


def test_active_makes_the_row_active_and_clears_leave_data(pact: Pact) -> None:
    change, row = handle(*examples(pact)[ACTIVE])
    assert change.status is AgentMembershipStatus.ACTIVE
    assert not change.contract_mismatch
    assert (row.membership_status, row.leave_reason, row.left_at, row.effective_at) == (
        "Active",
        None,
        None,
        None,
    )
    assert row.first_activity_at == datetime(2024, 6, 1, 9, 0, tzinfo=UTC)
    assert row.last_membership_version == change.payload.version == 1


def test_left_with_reason_keeps_reason_and_both_moments(pact: Pact) -> None:
    change, row = handle(*examples(pact)[LEFT_WITH_REASON])
    assert change.status is AgentMembershipStatus.LEFT
    assert change.leave_reason is LeaveReason.EXCLUDED_BY_AGENCY
    assert row.leave_reason == "ExcludedByAgency"
    assert row.left_at is not None
    assert row.effective_at is not None
    assert row.effective_at > row.left_at  # a deferred exclusion
    assert row.last_membership_version == 2


def test_left_without_reason_is_a_plain_leave(pact: Pact) -> None:
    change, row = handle(*examples(pact)[LEFT_WITHOUT_REASON])
    assert change.status is AgentMembershipStatus.LEFT
    assert (change.leave_reason, change.unknown_reason, change.payload.reason) == (
        None,
        False,
        None,
    )
    assert (row.membership_status, row.leave_reason, row.effective_at) == ("Left", None, None)
    assert row.left_at is not None


def test_every_example_is_handled_and_the_pact_is_written(pact: Pact) -> None:
    handled: list[uuid.UUID] = []

    def handler(body: str | bytes | None, metadata: dict[str, object]) -> None:
        change, _ = handle(record_value(body), dict(metadata))
        handled.append(change.message_id)

    pact.verify(handler, "Async")
    assert len(handled) == 3
    pact.write_file(PACT_DIR, overwrite=True)
    written = json.loads((PACT_DIR / f"{CONSUMER}-{PROVIDER}.json").read_text())
    assert sorted(i["description"] for i in written["interactions"]) == sorted(
        [ACTIVE, LEFT_WITH_REASON, LEFT_WITHOUT_REASON]
    )
