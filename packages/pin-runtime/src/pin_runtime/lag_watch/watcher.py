"""One pass of the lag watcher over every watched group, and the loop that repeats it.

A pass: each topic's partitions; the groups (the listed ones, and with discovery every group
holding offsets on a watched topic); their committed offsets; the partitions' watermarks;
the timestamp of each position's oldest unconsumed record (only where the group moved since
the last pass: the record at an offset never changes). The readings go to the `LagBook`,
whose series the gauges then show (`pin_runtime.lag_watch.lag` says how a failed read
ages them).

A topic's `last_success` moves only when every read of the pass for that topic succeeded;
the readiness check `kafka` is degraded while passes cannot reach the brokers. Every failed
read is counted by kind and logged once per pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from threading import Event

from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.lag_watch.brokers import BrokerReadError, Brokers, Partition
from pin_runtime.lag_watch.lag import LagBook, Position, Reading, oldest_offset, records_lag
from pin_runtime.lag_watch.metrics import LagWatchMetrics
from pin_runtime.lag_watch.settings import LagWatchSettings
from pin_runtime.logging import log_event

__all__ = ["LagWatcher", "PassReport", "WatchPlan"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchPlan:
    """What a watcher watches: the settings' part of it, in the watcher's own terms."""

    topics: tuple[str, ...]
    groups: tuple[str, ...]
    discover: bool
    exclude: frozenset[str]
    max_groups: int
    interval: float
    stale_after: float
    partitions: Mapping[str, int] = field(default_factory=dict)
    """The topic catalogue's partition count of the watched topics it fixes."""

    @classmethod
    def of(cls, settings: LagWatchSettings, *, reader_group: str) -> WatchPlan:
        """The plan of `settings`; the watcher's own reader group is never watched."""
        return cls(
            topics=tuple(dict.fromkeys(settings.lag_watch_topics)),
            groups=tuple(dict.fromkeys(settings.lag_watch_groups)),
            discover=settings.lag_watch_discover,
            exclude=frozenset(settings.lag_watch_exclude_groups) | {reader_group},
            max_groups=settings.lag_watch_max_groups,
            interval=settings.lag_watch_interval.total_seconds(),
            stale_after=settings.lag_watch_stale_after.total_seconds(),
            partitions=dict(settings.catalogue_partitions()),
        )


@dataclass
class PassReport:
    """What one pass saw: the failed reads (kind, message) and the topics read in full."""

    errors: list[tuple[str, str]] = field(default_factory=list)
    complete: set[str] = field(default_factory=set)
    watched: dict[str, list[str]] = field(default_factory=dict)
    """Topic -> the groups watched on it this pass."""

    def fail(self, kind: str, error: BrokerReadError | str) -> None:
        self.errors.append((kind, str(error)))


Offsets = dict[Partition, int]


@dataclass(eq=False)
class LagWatcher:
    plan: WatchPlan
    brokers: Brokers
    metrics: LagWatchMetrics
    state: ComponentState
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    book: LagBook = field(init=False)
    _discovered: dict[str, tuple[str, ...]] = field(init=False, default_factory=dict)
    _candidates: tuple[str, ...] = field(init=False, default=())
    """The groups discovery last read (each with its offsets reader)."""
    """Topic -> the groups discovery found last, watched again when a listing fails."""
    _shown: set[Position] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.book = LagBook(stale_after=self.plan.stale_after)
        for topic in self.plan.topics:
            # Exported from the start: a watcher that never succeeds shows 0 (very old).
            self.metrics.last_success.labels(topic).set(0)
            self.metrics.groups.labels(topic).set(0)
            if topic in self.plan.partitions:
                self.metrics.catalogue_partitions.labels(topic).set(self.plan.partitions[topic])

    def run(
        self,
        stop: Event,
        heartbeat: Heartbeat | None = None,
        *,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Pass after pass, one every interval, until `stop` is set (or, asked after each
        pass, `until()` is true: the process builds its clients again)."""
        while not stop.is_set() and not (until is not None and until()):
            started = self.clock()
            self.run_pass()
            if heartbeat is not None:
                heartbeat.beat()
            stop.wait(max(0.0, self.plan.interval - (self.clock() - started)))

    def run_pass(self) -> PassReport:
        started = self.clock()
        report = PassReport()
        partitions = self._partitions(report)
        offsets = self._group_offsets(partitions, report)
        marks = self._watermarks(partitions, report)
        done, unread = self._readings(partitions, offsets, marks, report)
        done |= self._timestamps(unread, report)
        at, now = self.clock(), self.wall()
        for position, reading in done.items():
            self.book.update(position, reading, at=at)
        self._publish(report, now=now, at=at)
        self.metrics.pass_seconds.observe(self.clock() - started)
        return report

    # -- reads --------------------------------------------------------------------------

    def _partitions(self, report: PassReport) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for topic in self.plan.topics:
            try:
                found[topic] = self.brokers.partitions(topic)
            except BrokerReadError as exc:
                report.fail("metadata", exc)
            else:
                # Beside the catalogue's count: a topic grown (or recreated) behind the
                # contract's back alerts from here, whether its consumers run or not.
                self.metrics.topic_partitions.labels(topic).set(len(found[topic]))
        return found

    def _group_offsets(
        self, partitions: Mapping[str, list[int]], report: PassReport
    ) -> dict[str, dict[str, Offsets | None]]:
        """Topic -> group -> its committed offsets on the topic (None: not read)."""
        held: dict[str, Offsets] = {}
        discovered: dict[str, tuple[str, ...]] = {}
        if self.plan.discover and partitions:
            discovered = self._discover(partitions, held, report)
        by_topic: dict[str, list[str]] = {}
        for topic in partitions:
            groups = list(self.plan.groups)
            groups += [g for g in discovered.get(topic, ()) if g not in self.plan.groups]
            by_topic[topic] = groups
        self._limit(by_topic, report)
        # The listed groups (and those discovery could not read) on every partition.
        asked = sorted({g for groups in by_topic.values() for g in groups} - held.keys())
        if asked:
            wanted = {t: partitions[t] for t in by_topic}
            for group, answer in self.brokers.committed(asked, wanted).items():
                if isinstance(answer, BrokerReadError):
                    report.fail("offsets", answer)
                else:
                    held[group] = answer
        self.brokers.keep_readers(set(held) | set(asked) | set(self._candidates))
        result: dict[str, dict[str, Offsets | None]] = {}
        for topic, groups in by_topic.items():
            result[topic] = {
                g: ({k: o for k, o in held[g].items() if k[0] == topic} if g in held else None)
                for g in groups
            }
            report.watched[topic] = groups
        return result

    def _discover(
        self, partitions: Mapping[str, list[int]], held: dict[str, Offsets], report: PassReport
    ) -> dict[str, tuple[str, ...]]:
        """Topic -> the groups holding offsets on it; `held` gets the offsets read."""
        try:
            candidates = [g for g in self.brokers.group_ids() if g not in self.plan.exclude]
        except BrokerReadError as exc:
            report.fail("discovery", exc)
            return self._discovered  # last pass's groups: their offsets are still read
        self._candidates = tuple(candidates)
        found: dict[str, list[str]] = {topic: [] for topic in partitions}
        for group, answer in self.brokers.committed(candidates, partitions).items():
            if isinstance(answer, BrokerReadError):
                report.fail("discovery", answer)
                # A group watched before stays watched (its offsets are asked again below).
                for topic, before in self._discovered.items():
                    if group in before and topic in found:
                        found[topic].append(group)
                continue
            topics = {t for (t, _), offset in answer.items() if offset >= 0 and t in found}
            if topics:
                held[group] = answer
            for topic in topics:
                found[topic].append(group)
        self._discovered = {topic: tuple(sorted(groups)) for topic, groups in found.items()}
        return self._discovered

    def _limit(self, by_topic: dict[str, list[str]], report: PassReport) -> None:
        """At most `max_groups` groups over all topics: the listed first, then by name."""
        kept: set[str] = set(self.plan.groups[: self.plan.max_groups])
        for group in sorted({g for groups in by_topic.values() for g in groups} - kept):
            if len(kept) >= self.plan.max_groups:
                report.fail("groups-limit", f"more than {self.plan.max_groups} groups to watch")
                break
            kept.add(group)
        for topic, groups in by_topic.items():
            by_topic[topic] = [g for g in groups if g in kept]

    def _watermarks(
        self, partitions: Mapping[str, list[int]], report: PassReport
    ) -> dict[Partition, tuple[int, int]]:
        every = [(t, p) for t, numbers in partitions.items() for p in numbers]
        if not every:
            return {}
        marks: dict[Partition, tuple[int, int]] = {}
        for key, answer in self.brokers.watermarks(every).items():
            if isinstance(answer, BrokerReadError):
                report.fail("watermarks", answer)
            else:
                marks[key] = answer
        return marks

    def _readings(
        self,
        partitions: Mapping[str, list[int]],
        offsets: Mapping[str, Mapping[str, Offsets | None]],
        marks: Mapping[Partition, tuple[int, int]],
        report: PassReport,
    ) -> tuple[dict[Position, Reading], dict[Position, tuple[int, int]]]:
        """The positions read in full, and those still needing the timestamp of their
        oldest record ((records, start)); a position whose offsets or watermarks were not
        read is in neither (it keeps its earlier reading, aged, until stale)."""
        done: dict[Position, Reading] = {}
        unread: dict[Position, tuple[int, int]] = {}
        for topic, groups in offsets.items():
            complete = True
            for group, held in groups.items():
                for partition in partitions[topic]:
                    mark = marks.get((topic, partition))
                    if held is None or mark is None:
                        complete = False
                        continue
                    low, high = mark
                    committed = held.get((topic, partition))
                    start = oldest_offset(low=low, committed=committed)
                    records = records_lag(low=low, high=high, committed=committed)
                    position = Position(group, topic, partition)
                    oldest = self.book.known_oldest(position, start) if records else None
                    if records and oldest is None:
                        unread[position] = (records, start)
                    else:
                        done[position] = Reading(records, start, oldest)
            if complete:
                report.complete.add(topic)
        return done, unread

    def _timestamps(
        self, unread: Mapping[Position, tuple[int, int]], report: PassReport
    ) -> dict[Position, Reading]:
        """The readings of `unread` whose oldest record could be read."""
        if not unread:
            return {}
        at = {p: (p.topic, p.partition, start) for p, (_, start) in unread.items()}
        found = self.brokers.oldest_timestamps(set(at.values()))
        done: dict[Position, Reading] = {}
        for position, (records, start) in unread.items():
            timestamp = found.get(at[position])
            if timestamp is not None:
                done[position] = Reading(records, start, timestamp)
                continue
            report.complete.discard(position.topic)
            report.fail(
                "timestamps",
                f"no record of {position.topic}[{position.partition}] at offset {start} "
                "within the request timeout",
            )
        return done

    # -- what the gauges show -------------------------------------------------------------

    def _publish(self, report: PassReport, *, now: float, at: float) -> None:
        watched = {(g, t) for t, groups in report.watched.items() for g in groups}
        # A group no longer watched (discovery moved on) leaves at once; a topic whose
        # groups could not be listed keeps its series until they are stale.
        if report.watched.keys() >= set(self.plan.topics):
            self.book.retire(watched)
        shown: set[Position] = set()
        for series in self.book.series(now=now, at=at):
            labels = (series.position.group, series.position.topic, str(series.position.partition))
            self.metrics.lag.labels(*labels).set(series.records)
            self.metrics.lag_seconds.labels(*labels).set(series.seconds)
            shown.add(series.position)
        for position in self._shown - shown:
            labels = (position.group, position.topic, str(position.partition))
            self.metrics.lag.remove(*labels)
            self.metrics.lag_seconds.remove(*labels)
        self._shown = shown
        for topic, groups in report.watched.items():
            self.metrics.groups.labels(topic).set(len(groups))
        for topic in report.complete:
            self.metrics.last_success.labels(topic).set(now)
        for kind, _ in report.errors:
            self.metrics.errors.labels(kind).inc()
        if report.errors:
            log_event(
                _log,
                "lag watch pass incomplete",
                logging.WARNING,
                errors=len(report.errors),
                first=report.errors[0][1],
                kinds=sorted({kind for kind, _ in report.errors}),
            )
        if set(self.plan.topics) <= report.complete:
            self.state.ok()
        else:
            reason = report.errors[0][1] if report.errors else "nothing read"
            self.state.degraded(reason, category="incomplete" if report.complete else "unavailable")
