"""The campaign's poison invariant: a poison row quarantined once; a poison record
dead-lettered at least once, and a second copy only after a fault that stopped a consumer."""

from __future__ import annotations

import uuid

from pin_e2e.chaos.invariants import poison_isolated

from pin_contracts import DeadLetterInfo
from pin_testkit.records import Record

ROW = uuid.uuid4()


def _dead_letter(partition: int, offset: int, dlq_offset: int) -> Record:
    info = DeadLetterInfo(
        error_code="REWARDS_MEMBERSHIP_EVENT_INVALID",
        exception_message="AgentUserId: must not be empty",
        exception_fqcn="InvalidEventError",
        original_topic="pin.identity.agent-membership-changed.v1",
        original_partition=partition,
        original_offset=offset,
        original_timestamp_ms=1,
        original_consumer_group="pin-rewards-identity-membership",
    )
    return Record("dlq", partition, dlq_offset, b"k", b"{}", info.to_headers())


def test_each_poison_isolated_once_holds() -> None:
    letters = [_dead_letter(2, 1, 0), _dead_letter(0, 7, 1)]
    held = poison_isolated({ROW: 1}, [ROW], letters, [(2, 1), (0, 7)], consumer_faults=0)
    assert held.holds, held.detail
    assert "0 copies" in held.detail


def test_a_second_dead_letter_is_a_violation_without_a_consumer_fault_and_not_with_one() -> None:
    letters = [_dead_letter(2, 1, 0), _dead_letter(2, 1, 1)]
    without = poison_isolated({ROW: 1}, [ROW], letters, [(2, 1)], consumer_faults=0)
    assert not without.holds
    assert "record 2/1: 2x" in without.detail
    with_one = poison_isolated({ROW: 1}, [ROW], letters, [(2, 1)], consumer_faults=1)
    assert with_one.holds, with_one.detail
    assert "1 copies, bound 1" in with_one.detail
    third = [*letters, _dead_letter(2, 1, 2)]
    assert not poison_isolated({ROW: 1}, [ROW], third, [(2, 1)], consumer_faults=1).holds


def test_a_poison_record_never_dead_lettered_or_a_row_quarantined_twice_is_a_violation() -> None:
    lost = poison_isolated({ROW: 1}, [ROW], [], [(2, 1)], consumer_faults=5)
    assert not lost.holds
    assert "record 2/1: 0x" in lost.detail
    twice = poison_isolated({ROW: 2}, [ROW], [_dead_letter(2, 1, 0)], [(2, 1)], consumer_faults=5)
    assert not twice.holds
    assert f"outbox {ROW}: 2x" in twice.detail
