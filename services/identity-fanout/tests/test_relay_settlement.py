"""The relay's decision on a round's rows, without a broker or a database."""

from __future__ import annotations

import random

from confluent_kafka import KafkaError

from identity_fanout.outbox.records import OutboxRecord
from identity_fanout.outbox.rules import Refusal, Settlement, settle
from pin_runtime.delivery import DeliveryFailure, classify

TOO_LARGE = DeliveryFailure("MSG_SIZE_TOO_LARGE", "too-large", "too big", retriable=False)
INVALID = DeliveryFailure("INVALID_RECORD", "invalid-record", "no", False)
TIMED_OUT = DeliveryFailure("_MSG_TIMED_OUT", "retriable", "Local: Message timed out", True)


def records(*ids: int) -> list[OutboxRecord]:
    return [OutboxRecord(id=i, topic="t", key=b"k", value=b"v", headers=[]) for i in ids]


def test_all_acknowledged_deletes_every_row() -> None:
    rows = records(1, 2, 3)
    s = settle(rows, {1, 2, 3}, {})
    assert s.delete == (1, 2, 3)
    assert s.quarantine == ()
    assert not s.stopped
    assert s.waiting == 0
    assert s.stop_reason() is None


def test_non_retriable_refusals_are_quarantined_and_the_round_goes_on() -> None:
    rows = records(1, 2, 3, 4)
    s = settle(rows, {1, 3}, {2: TOO_LARGE, 4: INVALID})
    assert s.delete == (1, 3)
    assert s.quarantine == (Refusal(rows[1], TOO_LARGE), Refusal(rows[3], INVALID))
    assert not s.stopped


def test_a_retriable_failure_stops_the_round_there_even_if_later_rows_were_acknowledged() -> None:
    rows = records(1, 2, 3, 4, 5)
    s = settle(rows, {1, 4, 5}, {2: TOO_LARGE, 3: TIMED_OUT})
    assert s.delete == (1,)  # 4 and 5 wait: re-sent later (a duplicate), never reordered
    assert [r.record.id for r in s.quarantine] == [2]
    assert s.stopped_at == rows[2]
    assert s.stop_failure == TIMED_OUT
    assert s.waiting == 3
    assert s.stop_reason() == "_MSG_TIMED_OUT: Local: Message timed out (outbox id 3, topic t)"


def test_a_row_without_outcome_stops_the_round() -> None:
    rows = records(7, 8, 9)
    s = settle(rows, {7}, {9: TOO_LARGE})
    assert s.delete == (7,)
    assert s.quarantine == ()  # 9 is behind the stop: decided in a later round
    assert s.stopped_at == rows[1]
    assert s.stop_failure is None
    assert s.waiting == 2
    assert s.stop_reason() == "no acknowledgement (outbox id 8, topic t)"


def test_a_refusal_of_the_cluster_stops_the_round_and_quarantines_nothing() -> None:
    # Not authorized for the topic: every row of it would be refused alike.
    rows = records(1, 2, 3)
    s = settle(rows, {1}, {2: classify(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))})
    assert (s.delete, s.quarantine, s.stopped_at, s.waiting) == ((1,), (), rows[1], 2)
    assert s.stop_failure is not None
    assert s.stop_failure.cluster_wide


def test_a_refusal_at_the_head_does_not_hold_up_the_rows_behind_it() -> None:
    rows = records(10, 11, 12)
    s = settle(rows, {11, 12}, {10: TOO_LARGE})
    assert s.delete == (11, 12)
    assert [r.record.id for r in s.quarantine] == [10]
    assert not s.stopped


def test_nothing_to_settle() -> None:
    s = settle([], set(), {})
    assert (s.delete, s.quarantine, s.stopped, s.waiting) == ((), (), False, 0)


def test_with_the_ids_kept_beside_the_rows_the_decision_is_the_same() -> None:
    # The in-flight window passes its ids (the C-level path): every mix of outcomes must
    # decide exactly as the row-by-row walk does.
    outcomes = ("ack", "too-large", "timed-out", "none")
    rng = random.Random(7)
    for _ in range(500):
        rows = records(*range(1, rng.randint(0, 12) + 1))
        acked: set[int] = set()
        failures: dict[int, DeliveryFailure] = {}
        for row in rows:
            outcome = rng.choice(outcomes)
            if outcome == "ack":
                acked.add(row.id)
            elif outcome == "too-large":
                failures[row.id] = TOO_LARGE
            elif outcome == "timed-out":
                failures[row.id] = TIMED_OUT
        assert settle(rows, acked, failures, [r.id for r in rows]) == walk(rows, acked, failures)


def walk(
    rows: list[OutboxRecord], acked: set[int], failures: dict[int, DeliveryFailure]
) -> Settlement:
    """The rule, one row at a time (the reference for the fast path)."""
    delete: list[int] = []
    quarantine: list[Refusal] = []
    for index, row in enumerate(rows):
        if row.id in acked:
            delete.append(row.id)
        elif row.id in failures and not failures[row.id].retriable:
            quarantine.append(Refusal(row, failures[row.id]))
        else:
            return Settlement(
                tuple(delete), tuple(quarantine), row, failures.get(row.id), len(rows) - index
            )
    return Settlement(tuple(delete), tuple(quarantine))
