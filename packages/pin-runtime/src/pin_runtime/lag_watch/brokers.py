"""What the lag watcher reads from Kafka, each read bounded by the request timeout.

An admin client lists the groups and the partitions' watermarks (requests of one kind are
sent together and awaited together). A group's committed offsets are read by a consumer
carrying that group's id, which never subscribes (it never joins the group, so the group's
members are not disturbed) and never commits: librdkafka's admin ListConsumerGroupOffsets
aborts the whole process when a coordinator connection drops mid-request
(`rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`, librdkafka 2.x), and a
broker restart is exactly when the watcher must keep running. A plain consumer reads the
oldest unconsumed record of a position to learn its timestamp: it `assign`s the partition at
that offset, never subscribes and never commits.

A read that fails is returned as a `BrokerReadError` in place of its value (or raised, when
nothing of the read came back), for the watcher to count and log; this module decides
nothing about lag.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Final, TypeVar

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from pin_runtime.errors import PinRuntimeError, TemplatedError
from pin_runtime.kafka import ConfigValue, create_admin, create_consumer
from pin_runtime.lag_watch.lag import PartitionLag, oldest_offset, records_lag

__all__ = ["READER_CONFIG", "BrokerReadError", "Brokers", "Partition", "RecordAt", "open_brokers"]

Partition = tuple[str, int]
"""(topic, partition)."""
RecordAt = tuple[str, int, int]
"""(topic, partition, offset)."""

# Requests in flight at once per kind: a cluster with hundreds of groups is asked in slices,
# so a pass never queues thousands of requests on one broker connection.
_IN_FLIGHT: Final = 32
# Margin on a future's wait beyond the request's own timeout (librdkafka answers a timed-out
# request itself, a moment after the timeout).
_MARGIN: Final = 1.0
# Each consume() of a timestamp read waits at most this long, so a pass notices its deadline.
_CONSUME_SLICE: Final = 0.5

T = TypeVar("T")

READER_CONFIG: Final[dict[str, ConfigValue]] = {
    # Small fetches: the reader needs one record per position it reads the timestamp of.
    "max.partition.fetch.bytes": 65536,
    "queued.max.messages.kbytes": 1024,
    "enable.partition.eof": False,
}


class BrokerReadError(PinRuntimeError, TemplatedError):
    """A read of the watcher failed or timed out; `what` names it (a group, a topic)."""

    template = "{what}: {reason}"
    what: str
    reason: str


def _reason(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(exc) or type(exc).__name__


def _slices(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Brokers:
    """The watcher's clients and its timeout; the caller owns (and closes) the admin client
    and the reader; the offset readers (`offsets_reader(group)`, one per watched group, kept
    while the group is watched) are this object's and go with `close()`."""

    def __init__(
        self,
        *,
        admin: AdminClient,
        reader: KafkaConsumer,
        offsets_reader: Callable[[str], KafkaConsumer],
        timeout: float,
    ) -> None:
        self._admin = admin
        self._reader = reader
        self._new_offsets_reader = offsets_reader
        self._offsets_readers: dict[str, KafkaConsumer] = {}
        self._timeout = timeout

    def serve_errors(self) -> None:
        """Hand the admin client's errors to its error callback now: librdkafka queues them
        until the client is polled, which its requests alone do not do."""
        self._admin.poll(0)

    def close(self) -> None:
        readers, self._offsets_readers = self._offsets_readers, {}
        for reader in readers.values():
            reader.close()

    def _wait(self, future: Future[T], deadline: float) -> T:
        return future.result(timeout=max(0.1, deadline - time.monotonic()))

    def partitions(self, topic: str) -> list[int]:
        """The partition numbers of `topic`; raises `BrokerReadError`."""
        try:
            metadata = self._admin.list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            raise BrokerReadError(f"metadata of {topic}", _reason(exc)) from None
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            reason = found.error.str() if found is not None and found.error else "no partitions"
            raise BrokerReadError(f"metadata of {topic}", reason)
        return sorted(found.partitions)

    def group_ids(self) -> list[str]:
        """Every consumer group the cluster knows, by name; raises `BrokerReadError` when
        a broker did not answer (a partial list would drop groups from discovery)."""
        deadline = time.monotonic() + self._timeout + _MARGIN
        try:
            future = self._admin.list_consumer_groups(request_timeout=self._timeout)
            listed: Any = self._wait(future, deadline)
        except (KafkaException, TimeoutError) as exc:
            raise BrokerReadError("consumer groups", _reason(exc)) from None
        if listed.errors:
            raise BrokerReadError("consumer groups", "; ".join(str(e) for e in listed.errors))
        return sorted({group.group_id for group in listed.valid})

    def committed(
        self, groups: Sequence[str], partitions: Mapping[str, Sequence[int]]
    ) -> dict[str, dict[Partition, int] | BrokerReadError]:
        """Each group's committed offsets on `partitions` (topic -> numbers; -1001 where it
        never committed), or the error of its read. The groups are read one after the
        other within one request timeout each and one for the whole call: those not read
        by then get an error (the watcher keeps their last reading)."""
        wanted = [TopicPartition(t, p) for t, numbers in partitions.items() for p in numbers]
        deadline = time.monotonic() + self._timeout + _MARGIN
        results: dict[str, dict[Partition, int] | BrokerReadError] = {}
        for group in groups:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                results[group] = BrokerReadError(f"offsets of group {group}", "pass deadline")
                continue
            results[group] = self._offsets(group, wanted, min(remaining, self._timeout))
        return results

    def keep_readers(self, groups: Collection[str]) -> None:
        """Close the offset readers of groups no longer read (discovery let them go); the
        watcher calls it once a pass with every group it read, so a reader lives as long as
        its group is watched instead of being made anew for each read."""
        for gone in self._offsets_readers.keys() - set(groups):
            self._offsets_readers.pop(gone).close()

    def _offsets(
        self, group: str, wanted: list[TopicPartition], timeout: float
    ) -> dict[Partition, int] | BrokerReadError:
        answer = self._commits(group, wanted, timeout)
        if isinstance(answer, BrokerReadError):
            return answer
        return {(tp.topic, tp.partition): int(tp.offset) for tp in answer}

    def _commits(
        self, group: str, wanted: list[TopicPartition], timeout: float
    ) -> list[TopicPartition] | BrokerReadError:
        """What `group` committed on `wanted`: offsets and the metadata committed with them."""
        reader = self._offsets_readers.get(group)
        try:
            if reader is None:
                reader = self._offsets_readers[group] = self._new_offsets_reader(group)
            answer: list[TopicPartition] = reader.committed(wanted, timeout=timeout)
        except KafkaException as exc:
            return BrokerReadError(f"offsets of group {group}", _reason(exc))
        for tp in answer:
            if tp.error is not None:
                reason = _reason(KafkaException(tp.error))
                return BrokerReadError(f"offsets of group {group}", reason)
        return answer

    def watermarks(
        self, partitions: Sequence[Partition]
    ) -> dict[Partition, tuple[int, int] | BrokerReadError]:
        """(low, high) watermark of each partition, or the error of its read."""
        asked: dict[str, dict[Any, Future[Any]]] = {}
        # The classmethods are untyped in confluent-kafka's own annotations.
        sides: tuple[tuple[str, OffsetSpec], ...] = (
            ("low", OffsetSpec.earliest()),  # type: ignore[no-untyped-call]
            ("high", OffsetSpec.latest()),  # type: ignore[no-untyped-call]
        )
        try:
            for side, spec in sides:
                asked[side] = self._admin.list_offsets(
                    {TopicPartition(t, p): spec for t, p in partitions},
                    request_timeout=self._timeout,
                )
        except KafkaException as exc:
            failed = BrokerReadError("watermarks", _reason(exc))
            return dict.fromkeys(partitions, failed)
        deadline = time.monotonic() + self._timeout + _MARGIN
        found: dict[Partition, dict[str, int]] = {}
        results: dict[Partition, tuple[int, int] | BrokerReadError] = {}
        for side, futures in asked.items():
            for tp, future in futures.items():
                key = (tp.topic, tp.partition)
                try:
                    found.setdefault(key, {})[side] = int(self._wait(future, deadline).offset)
                except (KafkaException, TimeoutError) as exc:
                    what = f"watermarks of {key[0]}[{key[1]}]"
                    results[key] = BrokerReadError(what, _reason(exc))
        for key in partitions:
            read = found.get(key, {})
            if key not in results:
                results[key] = (read["low"], read["high"])
        return results

    def lag_of(self, group: str, topic: str) -> list[PartitionLag]:
        """`group`'s lag on every partition of `topic`, in records and in time, now;
        raises `BrokerReadError` when a read failed (a status shows no partial answer)."""
        numbers = self.partitions(topic)
        commits = self._commits(group, [TopicPartition(topic, n) for n in numbers], self._timeout)
        if isinstance(commits, BrokerReadError):
            raise commits
        offsets = {(tp.topic, tp.partition): int(tp.offset) for tp in commits}
        notes = {tp.partition: tp.metadata for tp in commits if tp.metadata}
        marks = self.watermarks([(topic, n) for n in numbers])
        lags: list[tuple[int, int | None, int, int, int]] = []
        for number in numbers:
            read = marks[(topic, number)]
            if isinstance(read, BrokerReadError):
                raise read
            low, high = read
            committed = offsets.get((topic, number))
            committed = None if committed is None or committed < 0 else committed
            start = oldest_offset(low=low, committed=committed)
            lags.append(
                (
                    number,
                    committed,
                    high,
                    records_lag(low=low, high=high, committed=committed),
                    start,
                )
            )
        waiting = [(topic, n, start) for n, _, _, records, start in lags if records]
        stamps = self.oldest_timestamps(waiting)
        now = time.time()
        return [
            PartitionLag(
                topic=topic,
                partition=number,
                committed=committed,
                high=high,
                records=records,
                seconds=(
                    max(0.0, now - stamps[(topic, number, start)])
                    if (topic, number, start) in stamps
                    else None
                ),
                metadata=notes.get(number),
            )
            for number, committed, high, records, start in lags
        ]

    def oldest_timestamps(self, records: Collection[RecordAt]) -> dict[RecordAt, float]:
        """Unix time (s) of the first record at or after each (topic, partition, offset).

        One round per offset asked on the same partition (several groups at different
        offsets), all within one request timeout: what has not arrived by then is missing
        from the result (the watcher keeps the earlier reading of those positions).
        """
        by_partition: dict[Partition, list[int]] = {}
        for topic, partition, offset in sorted(set(records)):
            by_partition.setdefault((topic, partition), []).append(offset)
        found: dict[RecordAt, float] = {}
        deadline = time.monotonic() + self._timeout
        rounds = max((len(offsets) for offsets in by_partition.values()), default=0)
        for index in range(rounds):
            pending = {
                tp: offsets[index] for tp, offsets in by_partition.items() if index < len(offsets)
            }
            try:
                self._reader.assign([TopicPartition(t, p, o) for (t, p), o in pending.items()])
                try:
                    self._read_round(pending, found, deadline)
                finally:
                    self._reader.unassign()
            except KafkaException:
                break  # what was not read is missing: the watcher counts it and keeps the rest
            if time.monotonic() >= deadline:
                break
        return found

    def _read_round(
        self, pending: dict[Partition, int], found: dict[RecordAt, float], deadline: float
    ) -> None:
        while pending and (remaining := deadline - time.monotonic()) > 0:
            for message in self._reader.consume(
                num_messages=100, timeout=min(remaining, _CONSUME_SLICE)
            ):
                if message.error() is not None:
                    continue  # librdkafka retries a failed fetch itself; the deadline bounds it
                key = (str(message.topic()), int(message.partition() or 0))
                offset = pending.get(key)
                if offset is None or int(message.offset() or 0) < offset:
                    continue
                kind, milliseconds = message.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE:
                    found[(key[0], key[1], offset)] = milliseconds / 1000.0
                del pending[key]


@contextmanager
def open_brokers(
    bootstrap: str,
    *,
    client_id: str,
    security: Mapping[str, ConfigValue],
    timeout: float,
    on_error: Callable[[KafkaError], None] | None = None,
) -> Iterator[Brokers]:
    """`Brokers` with clients of its own (the admin client, the timestamp reader, an offsets
    reader per group read), all named after `client_id` and closed on exit: the lag watcher's
    and a `status` command's one way to ask the brokers. `on_error`: every client's errors
    (the lag watcher's `LoginRenewal` learns of a refused login there)."""
    admin = create_admin(bootstrap, client_id=client_id, extra=security, on_error=on_error)
    # Its group id is never joined nor committed to (assign only): librdkafka wants one.
    reader = create_consumer(
        bootstrap,
        group_id=client_id,
        client_id=f"{client_id}-reader",
        extra={**security, **READER_CONFIG},
        on_error=on_error,
    )
    brokers = Brokers(
        admin=admin,
        reader=reader,
        offsets_reader=lambda group: create_consumer(
            bootstrap,
            group_id=group,
            client_id=f"{client_id}-offsets",
            extra=security,
            on_error=on_error,
        ),
        timeout=timeout,
    )
    try:
        yield brokers
    finally:
        brokers.close()
        reader.close()
