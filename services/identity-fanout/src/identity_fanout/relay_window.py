"""The relay's in-flight window: records produced and not yet settled, in outbox id order.

The relay keeps producing while earlier acknowledgements are pending, up to `max_records`
records or `max_bytes` bytes of keys and values (each read asks for no more than the bytes
left, so a read ahead and one large row are the only overshoot); memory follows the
window, not the backlog. `settle()` takes the
settled prefix off the front with `relay_settlement.settle`'s rules: acknowledged rows to
delete, non-retriable refusals to quarantine, and it stops at the first row that is still
in flight (normal: wait) or was refused with a retriable error (the caller's failure path:
that row and all behind it go out again). Pure: no producer, no database.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Message

from identity_fanout.relay_records import OutboxRecord
from identity_fanout.relay_settlement import Settlement, settle
from pin_runtime.delivery import DeliveryFailure, DeliveryTracker

__all__ = ["DEFAULT_WINDOW_BYTES", "DEFAULT_WINDOW_RECORDS", "InflightWindow"]

DEFAULT_WINDOW_RECORDS: Final = 20_000
DEFAULT_WINDOW_BYTES: Final = 32 * 1024 * 1024


class InflightWindow:
    """Records produced and not yet settled; see the module docstring."""

    def __init__(self, *, max_records: int, max_bytes: int) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError(f"window limits must be >= 1, got {max_records}, {max_bytes}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: deque[OutboxRecord] = deque()
        self._produced_at: deque[float] = deque()
        self._bytes = 0
        self._slots: Counter[int] = Counter()
        self._keys: Counter[bytes] = Counter()
        self.tracker: DeliveryTracker[int] = DeliveryTracker()
        self._settled_topics: set[str] = set()
        self._settled_slots: set[int] = set()

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

    def add(self, records: Sequence[OutboxRecord], now: float) -> None:
        """Count `records` in (about to be produced, in this order)."""
        self._records.extend(records)
        self._produced_at.extend([now] * len(records))
        self._bytes += sum(len(r.key) + len(r.value) for r in records)
        self._slots.update(r.slot for r in records)
        self._keys.update(r.key for r in records)

    def expect(self, record: OutboxRecord) -> Callable[[KafkaError | None, Message], None]:
        """The `on_delivery` callback of `record` (added before)."""
        return self.tracker.expect(record.id)

    def refused(self, record: OutboxRecord, exc: KafkaException | BufferError) -> DeliveryFailure:
        """`produce()` raised for `record` (added just before)."""
        return self.tracker.refused(record.id, exc)

    def admissible(self, records: Sequence[OutboxRecord]) -> int:
        """How many of `records` (a read, in id order) may be produced now: the prefix up to
        the first record whose key is already in flight, here or earlier in the prefix.

        One record per key in flight keeps per-key order whatever Kafka does with them: when
        a record times out, the idempotent producer may still have a later one of the same
        partition acknowledged (after an epoch bump), and that later event would reach the
        consumers first. The rest of the read is read again once the earlier one settled.
        """
        keys = self._keys
        seen: set[bytes] = set()
        for index, record in enumerate(records):
            if record.key in seen or keys[record.key]:
                return index
            seen.add(record.key)
        return len(records)

    def busy_slots(self) -> set[int]:
        """Slots with a record in flight: their lanes may not be handed over yet."""
        return set(self._slots)

    def oldest_age(self, now: float) -> float:
        """Seconds since the head record was produced (0 when empty)."""
        return now - self._produced_at[0] if self._produced_at else 0.0

    def settle(self) -> Settlement:
        """Take the settled prefix off the front; `stopped_at` is the first unsettled row.

        `stop_failure` set means a retriable refusal (the failure path); None with
        `stopped_at` set means the head is still in flight.
        """
        settlement = settle(self._records, self.tracker.acknowledged, self.tracker.failures)
        self._pop(len(settlement.delete) + len(settlement.quarantine))
        return settlement

    def take_settled(self) -> tuple[set[str], set[int]]:
        """Topics and slots of the rows settled since the last call (for logs and probes)."""
        settled = self._settled_topics, self._settled_slots
        self._settled_topics, self._settled_slots = set(), set()
        return settled

    def clear(self) -> None:
        """Forget every record (after the failure path purged or waited them out)."""
        self._records.clear()
        self._produced_at.clear()
        self._slots.clear()
        self._keys.clear()
        self._bytes = 0
        self.tracker = DeliveryTracker()

    def _pop(self, count: int) -> None:
        """Take `count` settled records off the front (bulk operations: the hot path)."""
        if not count:
            return
        popleft = self._records.popleft
        popped = [popleft() for _ in range(count)]
        del_time = self._produced_at.popleft
        for _ in range(count):
            del_time()
        self._bytes -= sum(len(r.key) + len(r.value) for r in popped)
        slots = [r.slot for r in popped]
        self._slots.subtract(slots)
        self._slots = +self._slots  # drops the slots with nothing left in flight
        self._keys.subtract(r.key for r in popped)
        self._keys = +self._keys
        self._settled_slots.update(slots)
        self._settled_topics.update(r.topic for r in popped)
        self.tracker.acknowledged.difference_update(r.id for r in popped)
        failures = self.tracker.failures
        if failures:
            for r in popped:
                failures.pop(r.id, None)
