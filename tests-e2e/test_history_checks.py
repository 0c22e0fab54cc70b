"""The outbox history's checks are pure: each guarantee holds on a clean history and names
the first offending key and row of a broken one (`pin_e2e.history.checks`)."""

from __future__ import annotations

import itertools

from pin_e2e.history.checks import (
    Property,
    check_history,
    exercised,
    gauges_agree,
    key_history,
    percentile,
)
from pin_e2e.history.model import (
    History,
    Outcome,
    Publication,
    Row,
    Txn,
    WriterKind,
    from_json,
    key_slot,
    payload,
    to_json,
    token_of,
)

T0 = 1_000_000.0
BOUND = 10.0


def _same_slot_keys(count: int) -> list[str]:
    """`count` keys of one slot, and so of one writer lock."""
    by_slot: dict[int, list[str]] = {}
    for n in itertools.count():
        key = f"k{n}"
        found = by_slot.setdefault(key_slot(key), [])
        found.append(key)
        if len(found) == count:
            return found
    raise AssertionError("unreachable")


A, B = _same_slot_keys(2)
OTHER = next(f"o{n}" for n in itertools.count() if key_slot(f"o{n}") != key_slot(A))


class _Builder:
    """A history written by hand: transactions of one row each, and their records."""

    def __init__(self) -> None:
        self.history = History(started=T0)
        self._offsets: dict[int, int] = {}

    def txn(
        self,
        row_id: int,
        key: str,
        *,
        at: float,
        commit: float,
        kind: WriterKind = WriterKind.UNSERIALIZED,
        outcome: Outcome = Outcome.COMMITTED,
        seq: int | None = None,
    ) -> str:
        token = f"t{row_id}"
        row = Row(token, key, row_id, T0 + at, seq)
        self.history.txns.append(
            Txn(token, kind, (row,), T0 + at, T0 + commit, T0 + commit + 0.001, outcome)
        )
        return token

    def publish(self, token: str, key: str, at: float, partition: int = 0) -> None:
        offset = self._offsets.get(partition, 0)
        self._offsets[partition] = offset + 1
        self.history.publications.append(Publication(partition, offset, T0 + at, key, token))


def _failed(history: History) -> list[Property]:
    return check_history(history, bound=BOUND).violated


def test_a_clean_history_holds_every_guarantee_with_its_delays() -> None:
    b = _Builder()
    for n, key in enumerate((A, A, B), start=1):
        token = b.txn(n, key, at=n, commit=n + 0.5, kind=WriterKind.SERIALIZED, seq=n)
        b.publish(token, key, at=n + 0.7)
    b.txn(4, OTHER, at=4, commit=4.2, outcome=Outcome.ABORTED)
    verdict = check_history(b.history, bound=BOUND)
    assert verdict.violated == []
    assert max(verdict.delays.after_commit) < 0.3
    assert all(p.holds for p in verdict.properties)


def test_a_committed_row_never_published_is_lost_and_named() -> None:
    b = _Builder()
    b.publish(b.txn(1, A, at=0, commit=1), A, at=1.1)
    b.txn(2, B, at=1, commit=2)
    lost = _failed(b.history)
    assert lost[0].name.startswith("G1: every committed row published")
    assert lost[0].offender == (B, 2)
    assert "1 not published by the end" in lost[0].figures


def test_a_row_published_only_after_the_relays_restarted_is_not_in_time() -> None:
    b = _Builder()
    b.publish(b.txn(1, A, at=0, commit=1), A, at=5)
    b.history.restarted_at = T0 + 4
    assert _failed(b.history)[0].offender == (A, 1)
    b.history.restarted_at = T0 + 6
    assert _failed(b.history) == []


def test_the_bound_counts_from_the_end_of_the_slots_writers_at_the_commit() -> None:
    # Row 2 commits at 2 while the writer of row 1 (its slot) is open until 5: published at
    # 14, it waited 9 s after that writer, 12 s after its own commit.
    b = _Builder()
    b.publish(b.txn(1, A, at=0, commit=5), A, at=5.5)
    b.publish(b.txn(2, B, at=1, commit=2), B, at=14)
    assert _failed(b.history) == []
    # The same with the long writer in another slot: nothing excuses the wait.
    c = _Builder()
    c.publish(c.txn(1, OTHER, at=0, commit=5), OTHER, at=5.5)
    c.publish(c.txn(2, B, at=1, commit=2), B, at=14)
    late = _failed(c.history)
    assert [p.name.split(" of ")[0] for p in late] == ["G1: published within 10s"]
    assert late[0].offender == (B, 2)


def test_a_writer_that_began_after_the_commit_does_not_move_the_reference() -> None:
    b = _Builder()
    b.publish(b.txn(1, A, at=0, commit=1), A, at=12)
    b.publish(b.txn(2, B, at=2, commit=9), B, at=12.5)
    assert [p.offender for p in _failed(b.history)] == [(A, 1)]


def test_a_row_first_published_after_a_higher_id_of_its_key_is_an_inversion() -> None:
    b = _Builder()
    one, two = b.txn(1, A, at=0, commit=3), b.txn(2, A, at=1, commit=2)
    b.publish(two, A, at=2.1)
    b.publish(one, A, at=3.1)
    names = {p.name: p for p in _failed(b.history)}
    order = names["G2: per key, first publications in id order"]
    assert order.offender == (A, 1)
    assert "1 rows first published after a higher id" in order.figures
    assert names["G2: per key, the last record is its newest row"].offender == (A, 1)


def test_re_sends_are_allowed_while_the_newest_row_comes_last() -> None:
    b = _Builder()
    one, two = b.txn(1, A, at=0, commit=1), b.txn(2, A, at=1, commit=2)
    for token, at in ((one, 1.1), (two, 2.1), (one, 3), (two, 3.1)):
        b.publish(token, A, at=at)
    verdict = check_history(b.history, bound=BOUND)
    assert verdict.violated == []
    figures = " ".join(p.figures for p in verdict.properties)
    assert "1 older rows re-sent after a newer one" in figures
    assert "2 duplicates" in figures
    # The re-send of the older row last leaves the key on it.
    b.publish(one, A, at=4)
    assert [p.offender for p in _failed(b.history)] == [(A, 1)]


def test_a_serialized_key_published_out_of_commit_order_is_named() -> None:
    b = _Builder()
    one = b.txn(10, A, at=0, commit=2, kind=WriterKind.SERIALIZED, seq=1)
    two = b.txn(20, A, at=2, commit=2.1, kind=WriterKind.SERIALIZED, seq=2)
    b.publish(two, A, at=2.2)
    b.publish(one, A, at=2.5)
    serialized = next(p for p in _failed(b.history) if "commit order" in p.name)
    assert serialized.offender == (A, 10)
    assert "0 keys whose ids are not in commit order" in serialized.figures


def test_serialized_ids_out_of_commit_order_are_the_writers_fault_and_fail() -> None:
    b = _Builder()
    b.publish(b.txn(20, A, at=0, commit=1, kind=WriterKind.SERIALIZED, seq=1), A, at=1.1)
    b.publish(b.txn(10, A, at=1, commit=2, kind=WriterKind.SERIALIZED, seq=2), A, at=2.1)
    serialized = next(p for p in _failed(b.history) if "commit order" in p.name)
    assert "1 keys whose ids are not in commit order" in serialized.figures


def test_an_aborted_row_published_and_a_record_of_no_writer_fail() -> None:
    b = _Builder()
    aborted = b.txn(1, A, at=0, commit=1, outcome=Outcome.ABORTED)
    b.publish(aborted, A, at=1.1)
    b.history.publications.append(Publication(1, 0, T0 + 2, B, "nobody"))
    names = {p.name: p for p in _failed(b.history)}
    assert names["aborted rows never published"].offender == (A, 1)
    assert (
        "1 of no writer (first: 1@0)" in names["every record is a row of the run's writers"].figures
    )


def test_rows_of_a_transaction_in_doubt_are_neither_lost_nor_foreign() -> None:
    b = _Builder()
    b.txn(1, A, at=0, commit=1, outcome=Outcome.IN_DOUBT)
    doubt = b.txn(2, B, at=0, commit=1, outcome=Outcome.IN_DOUBT)
    b.publish(doubt, B, at=1.5)
    assert _failed(b.history) == []


def test_a_key_on_two_partitions_fails() -> None:
    b = _Builder()
    b.publish(b.txn(1, A, at=0, commit=1), A, at=1.1, partition=0)
    b.publish(b.txn(2, A, at=1, commit=2), A, at=2.1, partition=1)
    assert [p.name for p in _failed(b.history)] == ["per key, one partition"]


def test_the_gauges_agree_only_with_a_settled_status() -> None:
    assert gauges_agree((3, 3), {"relay-1": (3.0, 2.5), "relay-2": (3.0, 0.5)}).holds is True
    assert gauges_agree((0, 0), {"relay-1": (0.0, 0.0)}).holds is True
    blind = gauges_agree((3, 3), {"relay-1": (3.0, 2.5), "relay-2": (0.0, 0.0)})
    assert blind.holds is False
    assert "relay-2 0 (0s)" in blind.figures
    assert gauges_agree((3, 3), {"relay-1": (3.0, 0.0)}).holds is False  # a waiting row, no age
    assert gauges_agree((0, 0), {"relay-1": (0.0, 4.0)}).holds is False  # an age, no row
    assert gauges_agree((3, 1), {"relay-1": (3.0, 1.0)}).holds is None
    assert gauges_agree(None, {}).holds is None
    assert gauges_agree((0, 0), {}).holds is False  # no relay to show it
    assert gauges_agree((0, 0), {"relay-1": (None, None)}).holds is False  # no /metrics


def test_every_kind_of_fault_must_have_happened() -> None:
    b = _Builder()
    b.txn(1, A, at=0, commit=1, kind=WriterKind.SERIALIZED, seq=1)
    found = exercised(b.history, {"relays killed": 2, "long transactions held": 0})
    assert found.holds is False
    assert "late commits (>= 0.5s) 1" in found.figures
    assert "none of:" in found.figures
    assert "long transactions held" in found.figures.split("none of:")[1]
    assert "relays killed" not in found.figures.split("none of:")[1]


def test_a_row_committed_after_a_higher_id_of_its_slot_is_counted() -> None:
    b = _Builder()
    b.txn(1, A, at=0, commit=3)
    b.txn(2, B, at=1, commit=2)
    b.txn(3, OTHER, at=1, commit=2)
    assert "rows committed after a higher id of their slot 1" in exercised(b.history, {}).figures


def test_the_key_history_marks_the_offending_row() -> None:
    b = _Builder()
    one, two = b.txn(1, A, at=0, commit=3), b.txn(2, A, at=1, commit=2)
    b.publish(two, A, at=2.1)
    b.publish(one, A, at=3.1)
    lines = key_history(b.history, A, focus=1)
    marked = [line for line in lines if line.endswith("<==")]
    assert len(marked) == 2  # its write and its record
    assert marked[0].strip().startswith("id 1 t1")
    assert "+3.00s" in marked[0]  # times from the run's start


def test_a_long_key_history_shows_the_rows_around_the_offending_one() -> None:
    b = _Builder()
    for n in range(1, 101):
        b.publish(b.txn(n, A, at=n, commit=n + 0.1), A, at=n + 0.2)
    lines = key_history(b.history, A, focus=60)
    assert "  ... 47 before" in lines
    assert "  ... 28 after" in lines
    assert sum(line.endswith("<==") for line in lines) == 2


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 99) == 0.0
    assert percentile([5.0], 50) == 5.0


def test_a_payload_carries_its_token_and_nothing_else_is_read_as_one() -> None:
    assert token_of(payload("w:1", A, WriterKind.FLOOD)) == "w:1"
    assert token_of(b"not json") is None
    assert token_of(b'["w:1"]') is None
    assert token_of(None) is None


def test_a_history_kept_as_json_reads_back_equal() -> None:
    b = _Builder()
    token = b.txn(1, A, at=0, commit=1, kind=WriterKind.SERIALIZED, seq=1)
    b.publish(token, A, at=1.5)
    b.history.note(T0 + 2, "relay-1 SIGKILL")
    b.history.bystanders.append((T0 + 1, T0 + 3, "long transaction holding a transaction id"))
    b.history.restarted_at = T0 + 4
    assert from_json(to_json(b.history)) == b.history


def test_a_row_held_back_by_a_transaction_that_writes_no_outbox_row_is_named() -> None:
    b = _Builder()
    b.history.bystanders.append((T0 + 1, T0 + 9, "unrelated prepared transaction held"))
    b.publish(b.txn(1, A, at=2, commit=2.5), A, at=2.6)  # went out while it was held
    b.publish(b.txn(2, B, at=2, commit=3), B, at=9.1)  # waited for its end
    g3 = next(p for p in _failed(b.history) if p.name.startswith("G3"))
    assert g3.offender == (B, 2)
    assert "2 rows committed meanwhile: 1 published just after one ended" in g3.figures
    # Committed just before its end, or waiting for its own slot's writer, it did not wait.
    c = _Builder()
    c.history.bystanders.append((T0 + 1, T0 + 9, "long transaction holding a transaction id"))
    c.publish(c.txn(1, A, at=0, commit=8.5), A, at=8.6)
    c.publish(c.txn(2, B, at=2, commit=3), B, at=9.1)
    c.publish(c.txn(3, OTHER, at=5, commit=6), OTHER, at=9.2)
    # Late, but out before it ended, or long after: it did not wait for it (G1 judges).
    c.publish(c.txn(4, OTHER, at=1.5, commit=2), OTHER, at=7)
    c.publish(c.txn(5, A, at=1.5, commit=2), A, at=30)
    assert [p.name.split(" ")[0] for p in _failed(c.history)] == ["G1:"]
