"""The relay's in-flight window: records produced and not yet settled, in outbox id order.

The relay keeps producing while earlier acknowledgements are pending, up to `max_records`
records or `max_bytes` bytes of keys and values (each read asks for no more than the bytes
left, so one large row is the only overshoot); memory follows the
window, not the backlog. `settle()` takes the
settled prefix off the front with `rules.settle`: acknowledged rows to
delete, non-retriable refusals to quarantine, and it stops at the first row that is still
in flight (normal: wait) or was refused with a retriable error (the caller's failure path:
that row and all behind it go out again). Pure: no producer, no database.

Its bookkeeping runs for every record the relay publishes, so it is done per read and per
settled prefix, in bulk (`map` over attribute getters, set and Counter operations in C),
never with a Python step per record where a bulk one does. Every record is produced with
the same callback (`on_delivery`), which finds the record by its key: at most one record
per key is in flight, so the key names it. A closure per record cost about as much as the
`produce()` call itself. Each generation of outcomes (a new one after `clear`) has its own
callback and key map, so a late report of a record given up on never settles a later
record of the same key.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from confluent_kafka import KafkaError, KafkaException, Message
from opentelemetry import trace

from identity_fanout.outbox.records import OutboxRecord
from identity_fanout.outbox.rules import Settlement, settle
from pin_runtime.delivery import DeliveryFailure, DeliveryTracker

__all__ = ["InflightWindow", "ProducedTrace"]

_ID = attrgetter("id")
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_SLOT = attrgetter("slot")
_TOPIC = attrgetter("topic")


@dataclass(frozen=True, eq=False, slots=True)
class ProducedTrace:
    """Where a produced batch is traced: the span of its send, and the traces that wrote its
    rows (the trace ids of their stored traceparents, as the send span links them). One per
    send, known by identity (a span context holds an unhashable trace state)."""

    send: trace.SpanContext
    writers: tuple[str, ...] = ()


def _size(records: Sequence[OutboxRecord]) -> int:
    return sum(map(len, map(_KEY, records))) + sum(map(len, map(_VALUE, records)))


class InflightWindow:
    """Records produced and not yet settled; see the module docstring."""

    def __init__(self, *, max_records: int, max_bytes: int) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError(f"window limits must be >= 1, got {max_records}, {max_bytes}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: deque[OutboxRecord] = deque()
        self._ids: deque[int] = deque()
        """The records' ids, kept beside them: settling walks these (C-level)."""
        self._produced: deque[list[float]] = deque()
        """[when, records left] per produced batch, oldest first (one entry per read)."""
        self._traces: deque[ProducedTrace | None] = deque()
        """Each produced batch's trace, beside its entry of `_produced`."""
        self._settled_traces: set[ProducedTrace] = set()
        self._bytes = 0
        self._slots: Counter[int] = Counter()
        self._settled_topics: set[str] = set()
        self._settled_slots: set[int] = set()
        self._new_generation()

    def _new_generation(self) -> None:
        """A fresh tracker, key map and delivery callback (at start and after `clear`)."""
        tracker: DeliveryTracker[int] = DeliveryTracker()
        ids_by_key: dict[bytes, int] = {}
        """The id of the record in flight for each key: at most one (`admissible`, `add`)."""
        report, id_of = tracker.report, ids_by_key.get

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            id_ = id_of(message.key())  # type: ignore[arg-type]
            if id_ is not None:  # a key this generation never produced: not ours to settle
                report(id_, error)

        self.tracker = tracker
        self._keys = ids_by_key
        self.on_delivery = on_delivery
        """The `on_delivery` callback of every record produced into this window."""

    def __len__(self) -> int:
        return len(self._records)

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def last_id(self) -> int | None:
        """The highest outbox id in flight: the next read starts after it."""
        return self._records[-1].id if self._records else None

    def room(self) -> int:
        """Records that may still be added (0 once either limit is reached)."""
        if self._bytes >= self.max_bytes:
            return 0
        return max(0, self.max_records - len(self._records))

    def add(
        self, records: Sequence[OutboxRecord], now: float, traced: ProducedTrace | None = None
    ) -> None:
        """Count `records` in (about to be produced, in this order; `traced`: by that send).

        ValueError if a key would be in flight twice (a caller that skipped `admissible`):
        per-key order rests on it, so it is refused here rather than trusted.
        """
        if not records:
            return
        keys = list(map(_KEY, records))
        if len(set(keys)) != len(records) or not self._keys.keys().isdisjoint(keys):
            raise ValueError("a key would be in flight twice; produce admissible() rows only")
        ids = list(map(_ID, records))
        self._keys.update(zip(keys, ids, strict=True))
        self.tracker.expect_many(len(records))
        self._records.extend(records)
        self._ids.extend(ids)
        self._produced.append([now, len(records)])
        self._traces.append(traced)
        self._bytes += _size(records)
        self._slots.update(map(_SLOT, records))

    def refused(self, record: OutboxRecord, exc: KafkaException | BufferError) -> DeliveryFailure:
        """`produce()` raised for `record` (added just before)."""
        return self.tracker.refused(record.id, exc)

    def not_produced(self, count: int) -> None:
        """The last `count` records added were never handed to the producer (a retriable
        refusal stopped the read): no outcome will come for them."""
        self.tracker.pending -= count

    def admissible(self, records: Sequence[OutboxRecord]) -> int:
        """How many of `records` (a read, in id order) may be produced now: the prefix up to
        the first record whose key is already in flight, here or earlier in the prefix.

        One record per key in flight keeps per-key order whatever Kafka does with them: when
        a record times out, the idempotent producer may still have a later one of the same
        partition acknowledged (after an epoch bump), and that later event would reach the
        consumers first. The rest of the read is read again once the earlier one settled.
        """
        keys = self._keys
        read = list(map(_KEY, records))
        if keys.keys().isdisjoint(read) and len(set(read)) == len(read):
            return len(records)  # the usual case, decided in C
        seen: set[bytes] = set()
        for index, record in enumerate(records):
            if record.key in seen or record.key in keys:
                return index
            seen.add(record.key)
        return len(records)

    def busy_slots(self) -> set[int]:
        """Slots with a record in flight: their lanes may not be handed over yet."""
        return set(self._slots)

    def oldest_age(self, now: float) -> float:
        """Seconds since the head record was produced (0 when empty)."""
        return now - self._produced[0][0] if self._produced else 0.0

    def settle(self) -> Settlement:
        """Take the settled prefix off the front; `stopped_at` is the first unsettled row.

        `stop_failure` set means a retriable refusal (the failure path); None with
        `stopped_at` set means the head is still in flight.
        """
        tracker = self.tracker
        settlement = settle(self._records, tracker.acknowledged, tracker.failures, self._ids)
        self._pop(len(settlement.delete) + len(settlement.quarantine))
        return settlement

    def take_settled(self) -> tuple[set[str], set[int]]:
        """Topics and slots of the rows settled since the last call (for logs and probes)."""
        settled = self._settled_topics, self._settled_slots
        self._settled_topics, self._settled_slots = set(), set()
        return settled

    def take_settled_traces(self) -> set[ProducedTrace]:
        """The traces of the batches whose rows settled since the last call (for the
        `outbox published` line and its span)."""
        settled, self._settled_traces = self._settled_traces, set()
        return settled

    def clear(self) -> None:
        """Forget every record (after the failure path purged or waited them out)."""
        self._records.clear()
        self._ids.clear()
        self._produced.clear()
        self._traces.clear()
        self._slots.clear()
        self._bytes = 0
        self._new_generation()

    def _pop(self, count: int) -> None:
        """Take `count` settled records off the front (bulk operations: the hot path)."""
        if not count:
            return
        popleft, ids_popleft = self._records.popleft, self._ids.popleft
        popped = [popleft() for _ in range(count)]
        ids = [ids_popleft() for _ in range(count)]
        left = count
        while left:  # one step per produced batch, not per record
            batch = self._produced[0]
            taken = min(left, int(batch[1]))
            batch[1] -= taken
            left -= taken
            traced = self._traces[0]
            if traced is not None:
                self._settled_traces.add(traced)
            if not batch[1]:
                self._produced.popleft()
                self._traces.popleft()
        self._bytes -= _size(popped)
        slots = Counter(map(_SLOT, popped))  # counted in C (Counter.subtract is Python)
        self._slots.subtract(slots)
        for slot in slots:  # a few dozen slots at most
            if self._slots[slot] <= 0:
                del self._slots[slot]
        deque(map(self._keys.pop, map(_KEY, popped)), maxlen=0)  # each key's entry, in C
        self._settled_slots.update(slots)
        self._settled_topics.update(map(_TOPIC, popped))
        self.tracker.acknowledged.difference_update(ids)
        failures = self.tracker.failures
        if failures:
            for id_ in ids:
                failures.pop(id_, None)
