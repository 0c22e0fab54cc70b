"""The composition root: the consumer's world built from settings (no module-level clients).

`run_consumer` runs it on pin-runtime's shape (`long_running`: logging, tracing, signals,
ops server; `kafka_or_exit` first), as identity-fanout's `app` runs its worker and relay.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import time
from importlib.resources import files
from typing import Final

from confluent_kafka import KafkaError, Producer
from opentelemetry import trace

from pin_contracts import CATALOGUE, IDENTITY_MEMBERSHIP_DLQ
from pin_runtime.composition import collect_less, long_running
from pin_runtime.http import Check, CheckResult, ComponentState, Heartbeat
from pin_runtime.kafka import (
    KafkaConfig,
    LoginRenewal,
    create_consumer,
    create_producer,
    producer_config,
    refused_login,
    report_refused_login,
)
from pin_runtime.kafka_security import kafka_or_exit
from pin_runtime.logging import log_event
from pin_runtime.migrations import migrate
from pin_runtime.postgres import (
    OnRefused,
    SessionLimits,
    check_login,
    connect,
    report_auth_failure,
)
from pin_runtime.settings import settings_for_log
from rewards_membership.consumer.batch import Batches
from rewards_membership.consumer.database import BatchApplier, DatabaseThread
from rewards_membership.consumer.lag import LagReporter
from rewards_membership.consumer.loop import MembershipConsumer
from rewards_membership.consumer.partitions import PartitionControl, PartitionPauser
from rewards_membership.consumer.rebalance import RebalanceGuard
from rewards_membership.consumer.report import BatchReporter
from rewards_membership.consumer.spans import BatchSpans
from rewards_membership.db_roles import RUNTIME_ROLES
from rewards_membership.dlq.writer import DeadLetterer
from rewards_membership.metrics import Metrics
from rewards_membership.settings import ENV_PREFIX, SERVICE_NAME, Settings
from rewards_membership.store import MembershipStore

__all__ = [
    "SCHEMA",
    "build_consumer",
    "replay_producer_config",
    "run_consumer",
    "run_migrations",
]

SCHEMA = "rewards"
PREFETCH_KBYTES: Final = 16_384
"""The most the consumer's client prefetches (`queued.max.messages.kbytes`), in KiB."""
_log = logging.getLogger(__name__)


def run_migrations(
    dsn: str, session: SessionLimits | None = None, *, role_prefix: str = ""
) -> list[str]:
    """Apply the schema migrations, then the runtime roles and their privileges
    (`rewards_membership.db_roles`, named `role_prefix + name`) at every run.

    With `session` (the CLI passes `settings.database_session()`): its keepalives and
    idle-in-transaction timeout, but no statement or lock timeout: a migration may rewrite
    a large table, and a second runner must wait for the first one's advisory lock.
    """
    run = functools.partial(
        migrate,
        schema=SCHEMA,
        migrations=files("rewards_membership") / "migrations",
        roles=RUNTIME_ROLES,
        role_prefix=role_prefix,
    )
    if session is None:
        return run(dsn)
    unbounded = dataclasses.replace(session, statement_timeout=0, lock_timeout=0)
    with connect(dsn, unbounded) as conn:
        return run(conn)


def _dlq_producer_config(settings: Settings) -> dict[str, str | int | float | bool]:
    return {
        **settings.kafka_security(),
        # The producer gives up on a record exactly when the batch stops waiting for it,
        # so a record is never written after its batch moved on (and was retried).
        "message.timeout.ms": int(settings.delivery_timeout.total_seconds() * 1000),
        # Refuse in produce() what the DLQ topic would refuse: such a dead letter is
        # replaced by a reference record at once.
        "message.max.bytes": IDENTITY_MEMBERSHIP_DLQ.max_message_bytes,
    }


def replay_producer_config(settings: Settings, *, client_id: str) -> KafkaConfig:
    """`dlq replay`'s producer: it republishes what a source topic once accepted (up to the
    largest topic of the catalogue); the broker still checks the topic's own limit."""
    return producer_config(
        settings.kafka_bootstrap,
        client_id=client_id,
        extra={
            **settings.kafka_security(),
            "message.max.bytes": max(topic.max_message_bytes for topic in CATALOGUE),
            "message.timeout.ms": int(settings.delivery_timeout.total_seconds() * 1000),
        },
    )


def build_consumer(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    tracer: trace.Tracer | None = None,
    heartbeat: Heartbeat | None = None,
    client_id: str | None = None,
    renewal: LoginRenewal | None = None,
) -> tuple[MembershipConsumer, Producer]:
    """The consumer, every part of it built once here and handed down, and its DLQ
    producer (the caller flushes the producer on exit).

    `renewal`: told of every error of both clients, so a refused login is seen by the
    caller's loop (`run_consumer` builds them again once the password file is rotated)."""
    metrics = metrics or Metrics()
    database_state = ComponentState()
    kafka_state = ComponentState()

    def on_kafka_error(error: KafkaError) -> None:
        report_refused_login(
            error, settings.kafka_security(), metrics.auth_failures.labels("kafka").inc, log=_log
        )
        if (
            error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT)
            or error.fatal()
            or refused_login(error)
        ):
            kafka_state.degraded(f"{error.name()}: {error.str()}")
        if renewal is not None:
            renewal.refused(error)

    name = client_id or f"{SERVICE_NAME}-{socket.gethostname()}"
    consumer = create_consumer(
        settings.kafka_bootstrap,
        group_id=settings.group_id,
        client_id=name,
        extra={
            **settings.kafka_security(),
            # Records of a batch are fetched together; a bigger fetch keeps batches full.
            "fetch.wait.max.ms": 100,
            # The prefetch the client holds is capped at PREFETCH_KBYTES: librdkafka's
            # default (64 MiB) made the backlog in front of the consumer, not its batch,
            # what its memory grew with. Its record count (queued.min.messages) is left at
            # the default: set near the batch size, the queue ran dry between polls and the
            # poll loop lost its overlap with the database (docs/design/rewards-membership.md
            # "Memory").
            "queued.max.messages.kbytes": PREFETCH_KBYTES,
            "session.timeout.ms": int(settings.kafka_session_timeout.total_seconds() * 1000),
            "max.poll.interval.ms": settings.max_poll_interval_ms(),
        },
        on_error=on_kafka_error,
    )
    producer = create_producer(
        settings.kafka_bootstrap,
        client_id=f"{name}-dlq",
        extra=_dlq_producer_config(settings),
        on_error=on_kafka_error,
    )
    store = MembershipStore(
        settings.database_dsn.reveal(),
        application_name=name,
        session=settings.database_session(),
        on_refused=refused_logins(settings, metrics),
    )
    dead_letters = DeadLetterer(
        producer,
        topic=settings.dlq_topic,
        group_id=settings.group_id,
        delivery_timeout=settings.delivery_timeout.total_seconds(),
        on_tick=heartbeat.beat if heartbeat is not None else None,
    )
    tracer = tracer or trace.get_tracer("rewards_membership")
    clock = time.monotonic
    database = DatabaseThread(BatchApplier(store, tracer))
    partitions = PartitionControl(
        consumer,
        topic=settings.topic,
        pauser=PartitionPauser(
            initial=settings.retry_initial.total_seconds(),
            maximum=settings.retry_max.total_seconds(),
        ),
        metrics=metrics,
        clock=clock,
    )
    lag = LagReporter(
        # The lag gauges' own client, never in the group: asked through the polling
        # consumer, a request waits behind its long-poll fetch on the broker connection.
        create_consumer(
            settings.kafka_bootstrap,
            group_id=settings.group_id,
            client_id=f"{name}-lag",
            extra=settings.kafka_security(),
        ),
        topic=settings.topic,
        metrics=metrics,
        interval=settings.lag_interval.total_seconds(),
        clock=clock,
    )
    spans = BatchSpans(tracer=tracer, topic=settings.topic, group_id=settings.group_id)
    batches = Batches(
        database=database,
        dead_letters=dead_letters,
        partitions=partitions,
        spans=spans,
        reporter=BatchReporter(metrics=metrics, spans=spans),
        database_state=database_state,
        kafka_state=kafka_state,
    )
    membership = MembershipConsumer(
        consumer=consumer,
        topic=settings.topic,
        batch_size=settings.batch_size,
        poll_timeout=settings.poll_timeout.total_seconds(),
        database=database,
        partitions=partitions,
        batches=batches,
        rebalances=RebalanceGuard(
            consumer,
            topic=settings.topic,
            partitions=partitions,
            batches=batches,
            lag=lag,
            kafka_state=kafka_state,
        ),
        lag=lag,
        database_state=database_state,
        kafka_state=kafka_state,
        heartbeat=heartbeat,
        clock=clock,
    )
    return membership, producer


def run_consumer(settings: Settings) -> None:
    """`consume`: the consumer on pin-runtime's shape until SIGTERM/SIGINT."""
    # Every record becomes a dozen tracked objects (envelope, payload, UUIDs, the decided
    # item, the statement's row) and two or three batches are alive at once: with Python's
    # thresholds the collector walked them again and again, a large share of every record's
    # decoding, checking and encoding (docs/design/rewards-membership.md "Benchmark (one
    # batch statement)", "The collector").
    collect_less()
    metrics = Metrics()
    # Stale only after the longest batch the settings allow (the DLQ waits beat, a batch of
    # slow statements does not): restarting a pod in the middle of a legitimately slow batch
    # would only repeat it.
    heartbeat = Heartbeat(stale_after=settings.max_poll_interval_ms() / 1000.0)
    with long_running(
        SERVICE_NAME,
        log_level=settings.log_level,
        metrics_host=settings.metrics_host,
        metrics_port=settings.metrics_port,
        env_prefix=ENV_PREFIX,
        heartbeat=heartbeat,
        registry=metrics.registry,
    ) as rt:
        kafka_or_exit(settings, ENV_PREFIX, command="consume")
        # A refused database login exits 2 as refused Kafka credentials do (`check_login`).
        check_login(settings.database_dsn.reveal(), settings.database_session())
        renewal = LoginRenewal(settings.kafka_security())
        consumer, producer = build_consumer(
            settings, metrics=metrics, heartbeat=heartbeat, renewal=renewal
        )
        running = [consumer]
        try:
            ops = rt.serve(_readiness_of(running))
            # Who holds the database's xmin horizon back, every 15 s on a session of its own.
            rt.watch_horizon(
                settings.database_dsn.reveal(),
                settings.database_session(),
                on_refused=refused_logins(settings, metrics),
            )
            log_event(
                _log, "ops server listening", port=ops.port, settings=settings_for_log(settings)
            )
            log_event(_log, "consumer starting", topic=settings.topic, group=settings.group_id)
            consumer.run(rt.shutdown, until=renewal.due)
            while not rt.shutdown.requested:
                # The brokers refused the login and the SASL password file holds another
                # password: the consumer closed as at a stop (its batch finished, what is
                # applied committed, the group left); its clients are built again with the
                # file's password and join the group, which hands them their partitions
                # from the committed offsets (a record applied but not committed comes again
                # and changes nothing: the version guard).
                _drop(producer)
                renewal = LoginRenewal(settings.kafka_security())
                consumer, producer = build_consumer(
                    settings, metrics=metrics, heartbeat=heartbeat, renewal=renewal
                )
                running[0] = consumer
                log_event(
                    _log,
                    "kafka clients rebuilt with the rotated SASL password",
                    topic=settings.topic,
                    group=settings.group_id,
                )
                consumer.run(rt.shutdown, until=renewal.due)
        finally:
            producer.flush(settings.delivery_timeout.total_seconds())


def refused_logins(settings: Settings, metrics: Metrics) -> OnRefused:
    """What the consumer's connects (its batches' session, the horizon watch's) do with a
    login PostgreSQL refuses: `database authentication failed`, counted under postgresql."""
    dsn = settings.database_dsn.reveal()
    count = metrics.auth_failures.labels("postgresql").inc
    return lambda exc: report_auth_failure(exc, dsn, count, log=_log)


def _readiness_of(running: list[MembershipConsumer]) -> dict[str, Check]:
    """`/readyz`'s checks, each asked of the consumer running now (`running[0]`, replaced
    when its clients are built again)."""

    def ask(name: str) -> Check:
        def check() -> CheckResult:
            current = running[0].readiness_checks()[name]
            if isinstance(current, ComponentState) and not current.name:
                current.name = name  # its log lines name the component as /readyz does
            return current()

        return check

    return {name: ask(name) for name in running[0].readiness_checks()}


def _drop(producer: Producer) -> None:
    """The DLQ producer of clients being replaced. The consumer's close waited for its
    batch's dead letters; one still queued belongs to a batch that was not committed, whose
    records come again to the new consumer and are dead-lettered by its producer."""
    producer.flush(0)
    producer.purge(in_queue=True, in_flight=False)
    producer.poll(0)
