"""What became of each produced record: one tracker for every producer of both services.

librdkafka reports every record exactly once, on `poll`/`flush`, through its `on_delivery`
callback, or refuses it at once by raising from `produce()` (a record over
`message.max.bytes`, a full queue). A `DeliveryTracker` keys both kinds of outcome by a
token the caller chooses (a position in a batch, an outbox id), so a caller can ask which
records were acknowledged, which were refused and why, and whether the refusal can ever
succeed on a retry.

`classify` is the one place that says which Kafka errors are about the record itself (it
will be refused again, whatever the broker's health: set it aside), which are the cluster
refusing the client (not authorized, not authenticated, no such topic: every record of the
topic or the client would be refused alike, until an operator fixes the cluster; wait, and
say so) and which are about the path to the broker (wait and send it again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pin_runtime.errors import DeliveryError

__all__ = [
    "CLUSTER_WIDE",
    "NON_RETRIABLE",
    "DeliveryFailure",
    "DeliveryTracker",
    "classify",
    "flush_or_raise",
]

K = TypeVar("K", bound=Hashable)

NON_RETRIABLE: Final[dict[int, str]] = {
    # The record (or its batch) is larger than the client's message.max.bytes (raised by
    # produce) or the topic's max.message.bytes (reported by the broker).
    KafkaError.MSG_SIZE_TOO_LARGE: "too-large",
    KafkaError.RECORD_LIST_TOO_LARGE: "too-large",
    # The broker's validation of the record: a compacted topic without a key, a timestamp
    # outside the topic's window, a corrupt batch it will never accept.
    KafkaError.INVALID_RECORD: "invalid-record",
    KafkaError.INVALID_TIMESTAMP: "invalid-record",
    KafkaError._INVALID_ARG: "invalid-record",
    KafkaError._BAD_MSG: "invalid-record",
    KafkaError.TOPIC_EXCEPTION: "invalid-topic",
}
"""Error code -> reason label of the errors a retry of the same record cannot cure.

Everything else is retriable: broker down, timeouts, leadership changes, a queue that is
momentarily full, and the cluster-wide refusals below. An error missing here keeps the flow
waiting (visible, alerting) rather than setting aside a record that would have gone
through: for an access event, late is bad but lost is worse.
"""

CLUSTER_WIDE: Final[dict[int, str]] = {
    # The client's principal may not write the topic (ACLs), or may not use the cluster as
    # an idempotent producer (IdempotentWrite): one ACL mistake refuses every record alike.
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic-authorization",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster-authorization",
    # The credentials are refused (a rotated password, an expired certificate's SASL peer).
    KafkaError.SASL_AUTHENTICATION_FAILED: "authentication",
    KafkaError._AUTHENTICATION: "authentication",
    # The topic does not exist (not created yet, deleted, a typo in a deployment): reported
    # by the broker, or by the client once topic.metadata.propagation.max.ms ran out.
    KafkaError.UNKNOWN_TOPIC_OR_PART: "unknown-topic",
    KafkaError._UNKNOWN_TOPIC: "unknown-topic",
    # A record names a partition the topic does not have: the topic has fewer partitions
    # than the catalogue fixes (recreated smaller), every record pinned there is refused
    # alike until its count matches again.
    KafkaError._UNKNOWN_PARTITION: "partition-count",
}
"""Error code -> reason label of the refusals that are the cluster's, not the record's.

Retriable (the same record goes through once an operator fixed the ACL, the credentials or
the topic), never a reason to set a record aside: setting aside every record of a topic
because of one ACL would turn a pause into a pile of rows to retry by hand. A producer waits
and says so once (`DeliveryFailure.cluster_wide`), where an outage only waits.
"""


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """Why one record was not acknowledged."""

    code: str
    """The Kafka error name, e.g. MSG_SIZE_TOO_LARGE."""
    reason: str
    """A short label: too-large, invalid-record, invalid-topic (the record's); the cluster's
    refusal (`CLUSTER_WIDE`: topic-authorization, cluster-authorization, authentication,
    unknown-topic, partition-count); or retriable for every other failure a later attempt
    may cure."""
    message: str
    retriable: bool
    cluster_wide: bool = False
    """The cluster refuses the client, whatever the record (`CLUSTER_WIDE`); retriable too."""

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def classify(error: KafkaError | KafkaException | BufferError) -> DeliveryFailure:
    """The verdict on a delivery report's error or an exception `produce()` raised."""
    if isinstance(error, BufferError):
        return DeliveryFailure("_QUEUE_FULL", "retriable", str(error), retriable=True)
    if isinstance(error, KafkaException):
        inner = error.args[0] if error.args else None
        if not isinstance(inner, KafkaError):
            return DeliveryFailure("_UNKNOWN", "retriable", str(error), retriable=True)
        error = inner
    code = error.code()
    cluster = CLUSTER_WIDE.get(code)
    if cluster is not None:
        return DeliveryFailure(error.name(), cluster, error.str(), True, cluster_wide=True)
    reason = NON_RETRIABLE.get(code)
    return DeliveryFailure(
        code=error.name(),
        reason=reason or "retriable",
        message=error.str(),
        retriable=reason is None,
    )


class DeliveryTracker(Generic[K]):
    """Outcome per record of one batch, keyed by the caller's token.

    Produce each record with `on_delivery=tracker.expect(token)`; a `produce()` that raises
    is recorded with `tracker.refused(token, exc)`. Then `wait(producer, timeout)`.
    Single-threaded like the producer's callbacks (they run inside poll/flush).
    """

    def __init__(self) -> None:
        self.acknowledged: set[K] = set()
        self.failures: dict[K, DeliveryFailure] = {}
        self.pending = 0
        # Records produced with the tracker itself as `on_delivery` (no token): counted only.
        self._anonymous_acknowledged = 0
        self._anonymous_failures: list[DeliveryFailure] = []

    def __call__(self, error: KafkaError | None, _message: Message) -> None:
        """`on_delivery=tracker` for callers that only need counts and the first failure."""
        if error is None:
            self._anonymous_acknowledged += 1
        else:
            self._anonymous_failures.append(classify(error))

    def expect(self, token: K) -> Callable[[KafkaError | None, Message], None]:
        """The `on_delivery` callback of the record `token`."""
        self.pending += 1

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            self.report(token, error)

        return on_delivery

    def expect_many(self, count: int) -> None:
        """`count` more records whose outcomes a caller's own callback passes to `report`:
        one callback for every record instead of a closure each (a producer's hot path)."""
        self.pending += count

    def report(self, token: K, error: KafkaError | None) -> None:
        """The outcome of the record `token` (expected before)."""
        self.pending -= 1
        if error is None:
            self.acknowledged.add(token)
        else:
            self.failures[token] = classify(error)

    def refused(self, token: K, exc: KafkaException | BufferError) -> DeliveryFailure:
        """Record that `produce()` raised for `token` (after `expect` was called for it)."""
        self.pending -= 1
        failure = self.failures[token] = classify(exc)
        return failure

    @property
    def delivered(self) -> int:
        return len(self.acknowledged) + self._anonymous_acknowledged

    def all_failures(self) -> list[DeliveryFailure]:
        return [*self.failures.values(), *self._anonymous_failures]

    def is_acknowledged(self, token: K) -> bool:
        return token in self.acknowledged

    def wait(
        self,
        producer: Producer,
        timeout: float,
        *,
        slice_seconds: float = 0.5,
        on_tick: Callable[[], None] | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> int:
        """Serve delivery reports until none is pending or `timeout` passed; return pending.

        `on_tick` runs between slices (a liveness heartbeat); `give_up` ends the wait early
        (a shutdown). Records still pending afterwards have no outcome: the caller decides
        (purge them from the queue, retry them later).
        """
        deadline = time.monotonic() + timeout
        while self.pending > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (give_up is not None and give_up()):
                break
            producer.flush(min(remaining, slice_seconds))
            if on_tick is not None:
                on_tick()
        return self.pending

    def raise_for_failures(self) -> None:
        """`DeliveryError` naming the first failure, if any record failed or is pending."""
        failures = self.all_failures()
        if failures:
            first = failures[0]
            raise DeliveryError(
                f"{len(failures)} message(s) not delivered; first: {first.code} ({first.message})"
            )
        if self.pending:
            raise DeliveryError(f"{self.pending} message(s) not acknowledged in time")


def flush_or_raise(
    producer: Producer, timeout: float, tracker: DeliveryTracker[K] | None = None
) -> None:
    """Flush, then raise `DeliveryError` if anything is still queued or was refused."""
    remaining = producer.flush(timeout)
    if remaining:
        raise DeliveryError(f"{remaining} message(s) still queued after {timeout}s flush")
    if tracker is not None:
        tracker.raise_for_failures()
