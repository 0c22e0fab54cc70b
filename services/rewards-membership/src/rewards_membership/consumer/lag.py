"""The stall gauges, refreshed every lag interval whatever the batches do.

Offset lag per partition is the high watermark minus the group's COMMITTED offset, both
asked from the broker (a paused partition is not fetched, so cached watermarks would freeze):
a partition paused or stuck shows its lag growing. Beside it: how long each partition has
been paused, and how many dead letters wait for an operator.

The broker is asked through a consumer of its own that never joins the group (it only reads
the group's committed offsets and the watermarks). Asked through the polling consumer, each
request queued on the broker connection behind that consumer's long-poll fetch (a broker
answers one request of a connection at a time), so one refresh held the poll loop for a
fetch wait per partition, every interval (docs/design/rewards-membership.md "A row locked
elsewhere"). (An admin client would answer without blocking, but its offset listings leak
memory when called periodically and its destruction from a callback can abort the process:
confluent-kafka 2.x.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Final

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pin_runtime.logging import log_event
from rewards_membership.metrics import Metrics

__all__ = ["LagReporter", "offset_lag"]

_log = logging.getLogger(__name__)
# Each broker request of a refresh waits at most this long (the loop must keep polling).
_REQUEST_TIMEOUT: Final = 2.0


def offset_lag(*, low: int, high: int, committed: int) -> int | None:
    """Records not yet committed; from the log start when the group has no offset yet.

    None when the broker gave no watermark.
    """
    if high < 0:
        return None
    start = committed if committed >= 0 else max(low, 0)
    return max(0, high - start)


@dataclass(eq=False)
class LagReporter:
    reader: Consumer
    """Not the polling consumer: see the module's docstring."""
    _: KW_ONLY
    topic: str
    metrics: Metrics
    interval: float
    clock: Callable[[], float]
    _next: float = field(init=False, default=0.0)
    _paused_labels: set[int] = field(init=False, default_factory=set)

    def soon(self) -> None:
        """Refresh at the next turn (after an assignment)."""
        self._next = 0.0

    def maybe_report(
        self,
        assigned: Iterable[int],
        paused_for: Mapping[int, float],
        unreplayed: Callable[[], int | None],
    ) -> None:
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval
        self._report_paused(paused_for)
        partitions = sorted(assigned)
        if partitions:
            self._report_lag(partitions)
        count = unreplayed()
        if count is not None:
            self.metrics.dlq_unreplayed.set(count)

    def _report_paused(self, paused_for: Mapping[int, float]) -> None:
        gauge = self.metrics.partition_paused_seconds
        self.metrics.paused_partitions.set(len(paused_for))
        for partition, seconds in paused_for.items():
            gauge.labels(str(partition)).set(seconds)
        for partition in self._paused_labels - set(paused_for):
            with contextlib.suppress(KeyError):
                gauge.remove(str(partition))
        self._paused_labels = set(paused_for)

    def _report_lag(self, partitions: list[int]) -> None:
        try:
            committed = self.reader.committed(
                [TopicPartition(self.topic, p) for p in partitions], timeout=_REQUEST_TIMEOUT
            )
        except KafkaException as exc:
            log_event(_log, "lag refresh failed", logging.WARNING, reason=str(exc))
            return
        for tp in committed:
            try:
                low, high = self.reader.get_watermark_offsets(
                    TopicPartition(self.topic, tp.partition), timeout=_REQUEST_TIMEOUT
                )
            except KafkaException:
                return  # the broker does not answer: the others would wait as long
            lag = offset_lag(low=low, high=high, committed=tp.offset)
            if lag is not None:
                self.metrics.consumer_lag.labels(str(tp.partition)).set(lag)

    def close(self) -> None:
        self.reader.close()

    def forget(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(str(p))
            with contextlib.suppress(KeyError):
                self.metrics.partition_paused_seconds.remove(str(p))
            self._paused_labels.discard(p)
