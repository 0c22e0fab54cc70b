"""The relay's in-flight window without a broker or a database: limits and settled prefixes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from identity_fanout.outbox.records import OutboxRecord
from identity_fanout.outbox.rules import Settlement
from identity_fanout.outbox.window import InflightWindow


def record(id_: int, *, slot: int = 0, size: int = 10) -> OutboxRecord:
    """A record of a key of its own (one byte: sizes stay round), as `admissible` reads."""
    key = bytes([id_])
    return OutboxRecord(id=id_, topic="t", key=key, value=b"v" * (size - 1), headers=[], slot=slot)


Callbacks = dict[int, Callable[[KafkaError | None], None]]


class Report:
    """What the window reads of a delivery report: the record's key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def key(self) -> bytes:
        return self._key


def reports(window: InflightWindow, records: list[OutboxRecord]) -> Callbacks:
    """For each record, its delivery report as the producer would call the window with it."""
    on_delivery = window.on_delivery

    def report(key: bytes) -> Callable[[KafkaError | None], None]:
        return lambda error: on_delivery(error, Report(key))  # type: ignore[arg-type]

    return {r.id: report(r.key) for r in records}


def fill(window: InflightWindow, *ids: int, slot: int = 0, size: int = 10) -> Callbacks:
    records = [record(i, slot=slot, size=size) for i in ids]
    window.add(records, now=100.0)
    return reports(window, records)


def ack(callbacks: Callbacks, *ids: int) -> None:
    for i in ids:
        callbacks[i](None)


def fail(callbacks: Callbacks, id_: int, code: int) -> None:
    callbacks[id_](KafkaError(code))


def test_room_is_bounded_by_records_and_by_bytes() -> None:
    window = InflightWindow(max_records=5, max_bytes=1000)
    fill(window, 1, 2, 3)
    assert window.room() == 2
    assert (len(window), window.bytes) == (3, 30)
    big = InflightWindow(max_records=100, max_bytes=25)
    fill(big, 1, 2)
    assert big.room() == 98
    fill(big, 3)
    assert big.room() == 0  # 30 bytes >= 25: full, whatever the record count


def test_only_the_acknowledged_prefix_is_settled_and_memory_is_given_back() -> None:
    window = InflightWindow(max_records=10, max_bytes=10_000)
    callbacks = fill(window, 1, 2, 3, 4)
    ack(callbacks, 1, 2, 4)  # 3 is still in flight
    settlement = window.settle()
    assert settlement.delete == (1, 2)
    assert settlement.stopped_at is not None
    assert settlement.stopped_at.id == 3
    assert settlement.stop_failure is None  # in flight: wait, not a failure
    assert (len(window), window.bytes, window.last_id) == (2, 20, 4)
    assert window.tracker.acknowledged == {4}  # settled tokens are forgotten

    ack(callbacks, 3)
    assert window.settle().delete == (3, 4)
    assert (len(window), window.bytes, window.last_id, window.room()) == (0, 0, None, 10)
    assert window.tracker.acknowledged == set()


def middle_failed(code: int) -> tuple[InflightWindow, Settlement]:
    """Records 1, 2 and 3 in flight, 1 and 3 acknowledged, 2 failed with ``code``: the
    window and what it settles."""
    window = InflightWindow(max_records=10, max_bytes=10_000)
    callbacks = fill(window, 1, 2, 3)
    ack(callbacks, 1, 3)
    fail(callbacks, 2, code)
    return window, window.settle()


def test_a_refusal_for_good_is_quarantined_and_the_prefix_goes_on() -> None:
    window, settlement = middle_failed(KafkaError.MSG_SIZE_TOO_LARGE)
    assert settlement.delete == (1, 3)
    assert [r.record.id for r in settlement.quarantine] == [2]
    assert not settlement.stopped
    assert len(window) == 0


def test_a_retriable_failure_stops_there_and_keeps_the_rest() -> None:
    window, settlement = middle_failed(KafkaError._MSG_TIMED_OUT)
    assert settlement.delete == (1,)
    assert settlement.stop_failure is not None
    assert settlement.stop_failure.retriable
    assert settlement.waiting == 2  # 2 and 3 go out again, 3 although acknowledged
    window.clear()
    assert (len(window), window.bytes, window.tracker.pending) == (0, 0, 0)


def test_produce_refusals_and_busy_slots() -> None:
    window = InflightWindow(max_records=10, max_bytes=10_000)
    callbacks = fill(window, 1, slot=5)
    fill(window, 2, slot=9)
    refused = record(3, slot=9)
    window.add([refused], now=100.0)
    failure = window.refused(refused, KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)))
    assert not failure.retriable
    assert window.busy_slots() == {5, 9}
    ack(callbacks, 1)
    window.settle()
    assert window.busy_slots() == {9}  # lane of slot 5 may be handed over now
    assert window.oldest_age(103.5) == 3.5
    topics, slots = window.take_settled()
    assert (topics, slots) == ({"t"}, {5})
    assert window.take_settled() == (set(), set())


def keyed(id_: int, key: str) -> OutboxRecord:
    return OutboxRecord(id_, "t", key.encode(), b"v", [], 0)


def test_one_record_per_key_in_flight_the_rest_of_the_read_waits() -> None:
    window = InflightWindow(max_records=100, max_bytes=10_000)
    read = [keyed(1, "a"), keyed(2, "b"), keyed(3, "a"), keyed(4, "c")]
    assert window.admissible(read) == 2  # "a" again at id 3: stop before it
    window.add(read[:2], 0.0)
    callbacks = reports(window, read[:2])
    assert window.admissible([keyed(3, "a"), keyed(4, "c")]) == 0  # "a" still in flight
    assert window.admissible([keyed(4, "c"), keyed(3, "a")]) == 1
    callbacks[1](None)
    window.settle()
    assert window.admissible([keyed(3, "a"), keyed(4, "c")]) == 2  # "a" settled: it may go
    window.clear()
    assert window.admissible([keyed(5, "b")]) == 1


def test_a_key_already_in_flight_is_refused_and_nothing_is_counted() -> None:
    window = InflightWindow(max_records=100, max_bytes=10_000)
    window.add([keyed(1, "a")], 0.0)
    with pytest.raises(ValueError, match="in flight twice"):
        window.add([keyed(2, "b"), keyed(3, "a")], 0.0)
    with pytest.raises(ValueError, match="in flight twice"):
        window.add([keyed(4, "c"), keyed(5, "c")], 0.0)
    assert (len(window), window.last_id, window.admissible([keyed(6, "b")])) == (1, 1, 1)


def test_head_age_follows_the_batches_as_their_records_settle() -> None:
    window = InflightWindow(max_records=100, max_bytes=10_000)
    first = [record(i) for i in (1, 2, 3)]
    second = [record(i) for i in (4, 5)]
    window.add(first, 10.0)
    window.add(second, 20.0)
    callbacks = reports(window, first + second)
    ack(callbacks, 1, 2)
    window.settle()
    assert window.oldest_age(30.0) == 20.0  # 3 is left of the first batch
    ack(callbacks, 3, 4)
    window.settle()
    assert (len(window), window.oldest_age(30.0)) == (1, 10.0)
    ack(callbacks, 5)
    window.settle()
    assert (len(window), window.oldest_age(30.0), window.busy_slots()) == (0, 0.0, set())


def test_a_late_report_of_a_record_given_up_on_never_settles_a_later_one_of_its_key() -> None:
    window = InflightWindow(max_records=100, max_bytes=10_000)
    given_up = fill(window, 1)  # key b"\x01", no outcome: the failure path clears it
    window.clear()
    window.add([OutboxRecord(2, "t", bytes([1]), b"v", [], 0)], now=100.0)
    ack(given_up, 1)  # the first record's ack arrives now
    settlement = window.settle()
    assert settlement.delete == ()
    assert settlement.stopped_at is not None
    assert settlement.stopped_at.id == 2
    assert window.tracker.pending == 1  # the later record still waits for its own report


def test_records_never_produced_are_not_waited_for() -> None:
    window = InflightWindow(max_records=100, max_bytes=10_000)
    callbacks = fill(window, 1, 2, 3)
    window.not_produced(1)  # a retriable refusal of 2 stopped the read before 3
    window.refused(record(2), KafkaException(KafkaError(KafkaError._QUEUE_FULL)))
    ack(callbacks, 1)
    assert window.tracker.pending == 0
    assert window.settle().delete == (1,)
