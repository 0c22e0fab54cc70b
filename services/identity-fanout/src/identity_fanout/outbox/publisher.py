"""Producing outbox records and learning what became of each.

Every record's outcome is kept by the in-flight window's `pin_runtime.delivery.
DeliveryTracker`, keyed by its outbox id: acknowledged, refused (by `produce()` at once, or
by the broker in a delivery report, each classified retriable or not), or still without an
outcome. What to do with each is `rules.settle`'s decision, not this module's.
A refusal of the cluster the producer reports for itself (its credentials refused) is kept
as `refusal` until a record is acknowledged again: it is why records time out meanwhile.
Every record names its partition, by the catalogue's count (`partitions`): a topic with
fewer partitions than that, or none, refuses its records here as the cluster would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from confluent_kafka import KafkaError, KafkaException, Producer
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from identity_fanout.outbox.partitions import Change, TopicPartitions
from identity_fanout.outbox.records import OutboxRecord, span_links
from identity_fanout.outbox.window import InflightWindow, ProducedTrace
from pin_runtime.delivery import DeliveryFailure, classify
from pin_runtime.kafka import Compression, ConfigValue, LoginRenewal, create_producer
from pin_runtime.logging import log_event

__all__ = ["BATCH_SIZE_BYTES", "FLUSH_MARGIN", "Publisher"]

_log = logging.getLogger(__name__)

BATCH_SIZE_BYTES: Final = 1_000_000
"""librdkafka's `batch.size`, pinned: smaller than every catalogue topic's max.message.bytes."""
FLUSH_MARGIN: Final = 5.0
"""Added to the delivery timeout: librdkafka reports each message within its timeout, this
only covers scheduling slack."""
TOPIC_PROPAGATION_MS: Final = 10_000
"""librdkafka's `topic.metadata.propagation.max.ms` (its default: 30 s, the delivery timeout
itself): how long a topic the cluster does not know may be new. Past it the topic's records
fail as UNKNOWN_TOPIC_OR_PART, a refusal the relay pauses for and says so, where a timeout
would look like an outage. Topics are created before the services are deployed."""
METADATA_TIMEOUT: Final = 2.0
"""Seconds one look at a topic's partition count may take (an outage: seen next time)."""


class Publisher:
    """The relay's producer: produce into the in-flight window, serve reports, purge.

    A producer that hit a fatal error (e.g. the idempotent producer fenced) is replaced
    before the next round; so is one whose login the brokers refuse once its SASL password
    file holds another password (`<PREFIX>KAFKA_SASL_PASSWORD_FILE` rotated).
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        client_id: str,
        message_max_bytes: int,
        compression: Compression,
        extra: Mapping[str, ConfigValue] | None,
        delivery_timeout: float,
        tracer: trace.Tracer,
        partitions: Mapping[str, int] | None = None,
        on_partitions: Callable[[str, int], None] | None = None,
    ) -> None:
        """`partitions`: the catalogue's count per topic, what records are pinned by;
        `on_partitions(topic, count)`: each count seen in the metadata (0: no such topic)."""
        self._bootstrap = bootstrap
        self._client_id = client_id
        self._config: dict[str, ConfigValue] = {
            # Compared by produce() with the UNCOMPRESSED record: a larger one is refused at
            # once (MSG_SIZE_TOO_LARGE, quarantined); the broker compares the compressed batch
            # with the topic's max.message.bytes.
            "message.max.bytes": message_max_bytes,
            # Several records share a batch only up to this many (uncompressed) bytes, below
            # the smallest topic limit (1 MiB): the broker's size check never refuses small
            # records together with a large one, which always travels in a batch of its own.
            "batch.size": BATCH_SIZE_BYTES,
            **(extra or {}),
            # A dead broker must surface as failed deliveries, not as a wait without end.
            "message.timeout.ms": max(1, int(delivery_timeout * 1000)),
            "topic.metadata.propagation.max.ms": TOPIC_PROPAGATION_MS,
        }
        self._compression: Compression = compression
        self._delivery_timeout = delivery_timeout
        self._tracer = tracer
        self._producer: Producer | None = None
        self._fatal = False
        self._renewal = LoginRenewal(self._config)
        self.refusal: DeliveryFailure | None = None
        # Since when librdkafka reported every broker down (`_ALL_BROKERS_DOWN`), until a
        # record is acknowledged or a metadata request answered: an outage while rows wait
        # shows no delivery error for RELAY_DELIVERY_TIMEOUT (librdkafka retries), and
        # readiness must say it at once (docs/design/identity-fanout.md "Outages").
        self.unreachable_since: float | None = None
        """A cluster-wide refusal the client reported (error_cb) since the last ack."""
        self._partitions = TopicPartitions.of(partitions or {})
        self._on_partitions = on_partitions
        self._topics: set[str] = set()
        """Topics of the records produced so far: the ones looked at besides the catalogue's."""
        # Made now, not at the first row: librdkafka checks its settings when a client is
        # made, so a value it refuses stops the relay as it starts, not at its first burst.
        self._current_producer()

    def produce(self, records: Sequence[OutboxRecord], window: InflightWindow) -> bool:
        """Produce `records` in order into `window`, without waiting for acknowledgements.

        False when a retriable refusal (a full queue, a fatal producer) stopped it: that
        record is in the window with its failure, the rest were not produced.
        """
        producer = self._current_producer()
        self._topics.update(r.topic for r in records)
        self._check_partitions(producer)
        pins = self._partitions
        now = time.monotonic()
        produced = True
        name, attributes = _span(records, self._client_id)
        links = span_links(records)
        # CLIENT: the writing transaction, not this send, is the messages' creation context.
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes=attributes, links=links
        ) as span:
            writers = tuple(dict.fromkeys(format(link.context.trace_id, "032x") for link in links))
            window.add(records, now, ProducedTrace(span.get_span_context(), writers))
            send, report = producer.produce, window.on_delivery  # bound once per read
            for index, record in enumerate(records):
                try:
                    if not pins.usable(record.topic):
                        raise pins.refusal(record.topic)
                    # Headers go out as stored: their traceparent is the writer's context.
                    send(
                        record.topic,
                        key=record.key,
                        value=record.value,
                        partition=pins.partition(record.topic, record.key),
                        headers=record.headers,
                        on_delivery=report,
                    )
                except (BufferError, KafkaException) as exc:
                    # Too large for message.max.bytes: refused for good, the next goes on.
                    # Queue full or a fatal producer: the rest waits for the next read.
                    failure = window.refused(record, exc)
                    if failure.retriable:
                        span.set_status(Status(StatusCode.ERROR, str(failure)))
                        window.not_produced(len(records) - index - 1)
                        produced = False
                        break
            producer.poll(0)  # serve the reports already there; never blocks
        return produced

    def serve(self, timeout: float) -> None:
        """Serve delivery reports for up to `timeout` seconds (returns at the first)."""
        if self._producer is not None:
            self._check_partitions(self._producer)
            self._producer.poll(timeout)

    def _check_partitions(self, producer: Producer) -> None:
        """Look at the partition counts due (`TopicPartitions.due`): one metadata request
        per topic, every `partitions.CHECK_INTERVAL` seconds or at a try of a waiting one."""
        now = time.monotonic()
        due = self._partitions.due(self._topics, now)
        if not due:
            return
        counts: dict[str, int | None] = {}
        for topic in sorted(due):
            try:
                metadata = producer.list_topics(topic, timeout=METADATA_TIMEOUT).topics.get(topic)
            except KafkaException:
                continue  # the cluster is away: an outage, seen by the deliveries
            self.unreachable_since = None  # a broker answered
            error = None if metadata is None else metadata.error
            if metadata is None or (
                error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            ):
                counts[topic] = None
            elif error is None:
                counts[topic] = len(metadata.partitions)
        for change in self._partitions.observe(counts, now, looked=due):
            _report_partitions(change)
        if self._on_partitions is not None:
            for topic, count in counts.items():
                self._on_partitions(topic, count or 0)

    def wait(
        self,
        window: InflightWindow,
        *,
        on_tick: Callable[[], None] | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> int:
        """Wait (bounded) for every outcome in `window`; the records still without one."""
        if self._producer is None:
            return window.tracker.pending
        timeout = self._delivery_timeout + FLUSH_MARGIN
        return window.tracker.wait(self._producer, timeout, on_tick=on_tick, give_up=give_up)

    def purge(self) -> None:
        """Drop what is still queued (not sent): those rows stay in the outbox. In-flight
        requests cannot be recalled; a late ack of one only means a duplicate later."""
        if self._producer is not None:
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.poll(0)

    def close(self, grace: float) -> None:
        """Give in-flight deliveries `grace` seconds, then drop the rest and close."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if producer.flush(grace) > 0:
            producer.purge(in_queue=True, in_flight=True)
            producer.poll(0)
        producer.close()

    def _current_producer(self) -> Producer:
        if self._producer is not None and self._fatal:
            log_event(_log, "kafka producer replaced after fatal error", logging.WARNING)
            self.close(0.0)
        if self._producer is not None and self._password_renewed():
            # What the old client still held goes back to the outbox (purged, retried).
            log_event(_log, "kafka producer rebuilt with the rotated SASL password")
            self.close(0.0)
        if self._producer is None:
            self._fatal = False
            self._renewal = LoginRenewal(self._config)
            self._producer = create_producer(
                self._bootstrap,
                client_id=self._client_id,
                compression=self._compression,
                extra=self._config,
                on_error=self._on_error,
            )
        return self._producer

    def _password_renewed(self) -> bool:
        """Since the brokers refused the login: whether the SASL password file holds a new
        password (`LoginRenewal`; then `_config` has it)."""
        renewed = self._renewal.renewed()
        if renewed is None:
            return False
        self._config = renewed
        self.refusal = None
        return True

    def _on_error(self, error: KafkaError) -> None:
        self._renewal.refused(error)
        if error.code() == KafkaError._ALL_BROKERS_DOWN and self.unreachable_since is None:
            self.unreachable_since = time.monotonic()
        if error.fatal():
            self._fatal = True
        failure = classify(error)
        if failure.cluster_wide:
            self.refusal = failure


def _report_partitions(change: Change) -> None:
    if change.matches:
        log_event(
            _log,
            "kafka topic partitions match the catalogue again",
            topic=change.topic,
            partitions=change.observed,
        )
        return
    log_event(
        _log,
        "kafka topic partitions differ from the catalogue",
        logging.WARNING,
        topic=change.topic,
        partitions=change.observed,
        expected=change.expected,
        # More: published on as pinned. Fewer or none: the topic's records wait.
        publishing="pinned" if (change.observed or 0) > change.expected else "paused",
    )


def _span(records: Sequence[OutboxRecord], client_id: str) -> tuple[str, dict[str, str | int]]:
    """Name and attributes of the span of one produced batch (messaging conventions)."""
    topics = sorted({r.topic for r in records})
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.batch.message_count": len(records),
        "messaging.client.id": client_id,
    }
    if len(topics) == 1:  # the conventions omit the destination of a mixed batch
        attributes["messaging.destination.name"] = topics[0]
    return (f"send {topics[0]}" if len(topics) == 1 else "send"), attributes
