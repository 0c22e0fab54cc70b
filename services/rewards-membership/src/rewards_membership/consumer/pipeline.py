"""The one batch in flight and the finished batches waiting to be reported.

The poll loop hands a decoded batch over (`start`) and later asks for it to be finished
(`settle`: its transaction's outcome, dead letters, inbox marks, offset commit, or pause
and seek back). Metrics, logs and spans of a committed batch are written by `report`,
after the next batch has started, so they are never on the path from poll to commit.
At most one batch is in flight: `start` is only called after `settle`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Message
from opentelemetry import trace

from rewards_membership.consumer.finish import BatchFinisher
from rewards_membership.consumer.inflight import Finished, InFlight, bounds
from rewards_membership.consumer.report import BatchReporter
from rewards_membership.rules.validation import Item

__all__ = ["BatchPipeline"]


@dataclass(eq=False, kw_only=True)
class BatchPipeline:
    finisher: BatchFinisher
    """Owns the database thread the batches are submitted to."""
    reporter: BatchReporter
    """Starts a batch's spans too (`reporter.spans`)."""
    clock: Callable[[], float] = time.monotonic
    in_flight: InFlight | None = field(init=False, default=None)
    _unreported: list[Finished] = field(init=False, default_factory=list)

    def start(self, records: Sequence[Message], items: Sequence[Item]) -> None:
        """Hand the batch to the database thread; its transaction runs while the loop polls."""
        receive, process = self.reporter.spans.start(records)
        with trace.use_span(process, end_on_exit=False):
            plan = self.finisher.database.submit(items)
        first, last = bounds(records)
        self.in_flight = InFlight(
            records=records,
            items=items,
            first=first,
            last=last,
            started=self.clock(),
            receive=receive,
            process=process,
            plan=plan,
        )

    def settle(self, exclude: Sequence[int] = ()) -> None:
        """Finish the batch in flight, if any (waits for its transaction); `exclude` are
        partitions lost meanwhile, neither dead-lettered nor committed here."""
        batch, self.in_flight = self.in_flight, None
        if batch is None:
            return
        finished = self.finisher.finish(batch, now=self.clock(), exclude=exclude)
        if finished is not None:
            self._unreported.append(finished)

    def settle_and_report(self, exclude: Sequence[int]) -> None:
        self.settle(exclude)
        self.report()

    def report(self) -> None:
        """Write the metrics, logs and spans of every batch finished since the last call."""
        unreported, self._unreported = self._unreported, []
        for finished in unreported:
            try:
                self.reporter.report(
                    finished.done,
                    finished.receipts,
                    elapsed_ms=finished.elapsed_ms,
                    batch_context=finished.receive.get_span_context(),
                )
            finally:
                finished.receive.end()
