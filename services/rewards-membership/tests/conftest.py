"""Fixtures of the rewards-membership tests: a migrated database, topics, a running consumer.

The database is migrated as its owner; `database`, `rows` and `sql` (the owner) set up and
check state. The consumer connects as its runtime role (`settings` carries `consumer_dsn`),
the CLI's tooling as the operator's (`operator_dsn`), so a statement the migrations did not
grant to that role fails the test with SQLSTATE 42501.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, LiteralString

import msgspec
import psycopg
import pytest
from confluent_kafka import Producer
from consumer_kit import ConsumerKit, RawRecord, publish, publish_raw, record_of

from pin_contracts import (
    AgentMembershipChanged,
    Envelope,
    envelope_for,
)
from pin_runtime.kafka import create_producer
from pin_runtime.settings import Secret
from pin_runtime.shutdown import GracefulShutdown
from pin_testkit.events import membership_event
from pin_testkit.fixtures import login_dsn
from pin_testkit.waiting import wait_until
from rewards_membership.app import build_consumer, run_migrations
from rewards_membership.db_roles import CONSUMER, OPERATOR
from rewards_membership.metrics import Metrics
from rewards_membership.settings import Settings

# The sample payload builder of every suite; `event` hands it to the tests.
membership = membership_event


def raw_value(payload: AgentMembershipChanged, **envelope_overrides: Any) -> bytes:
    """Record value bypassing the encoder's checks (unknown enums, other ContractVersion)."""
    envelope = envelope_for(payload)
    data = msgspec.json.decode(msgspec.json.encode(envelope))
    data.update(envelope_overrides)
    return msgspec.json.encode(data)


@dataclass
class Kafka:
    bootstrap: str
    topic: str
    dlq_topic: str
    producer: Producer

    def send(self, *payloads: AgentMembershipChanged) -> list[Envelope[AgentMembershipChanged]]:
        return publish(self.producer, self.topic, *payloads)

    def send_envelopes(self, *envelopes: Envelope[AgentMembershipChanged]) -> None:
        publish_raw(self.producer, self.topic, *map(record_of, envelopes))

    def send_raw(self, *records: RawRecord) -> None:
        publish_raw(self.producer, self.topic, *records)


@pytest.fixture
def wait() -> Callable[..., float]:
    """`wait(condition, timeout=..., what=...)`: `pin_testkit.waiting.wait_until`."""
    return wait_until


@pytest.fixture
def event() -> Callable[..., AgentMembershipChanged]:
    """`event(agent, company, version, status, reason=..., ...)`: a membership payload."""
    return membership


@pytest.fixture
def raw() -> Callable[..., bytes]:
    """`raw(payload, **envelope_overrides)`: a record value the encoder would refuse."""
    return raw_value


@pytest.fixture
def database(make_database: Callable[..., str]) -> str:
    """DSN of a fresh clone of a migrated rewards database (as its owner)."""
    return make_database("rewards-membership", run_migrations)


consumer_dsn = login_dsn(CONSUMER, "database")
operator_dsn = login_dsn(OPERATOR, "database")  # dlq, agent show, inbox prune


@pytest.fixture
def kafka(kafka_bootstrap: str, kafka_topic: Callable[..., str]) -> Iterator[Kafka]:
    producer = create_producer(kafka_bootstrap, client_id="rewards-membership-tests", linger_ms=1)
    yield Kafka(kafka_bootstrap, kafka_topic(partitions=3), kafka_topic(partitions=3), producer)
    producer.flush(10)


@pytest.fixture
def settings(consumer_dsn: str, kafka: Kafka) -> Settings:
    return Settings(
        database_dsn=Secret(consumer_dsn),
        kafka_bootstrap=kafka.bootstrap,
        topic=kafka.topic,
        dlq_topic=kafka.dlq_topic,
        group_id=f"rewards-membership-test-{uuid.uuid4().hex[:8]}",
        batch_size=200,
        poll_timeout=timedelta(milliseconds=200),
        retry_initial=timedelta(milliseconds=200),
        retry_max=timedelta(seconds=1),
        delivery_timeout=timedelta(seconds=20),
        lag_interval=timedelta(milliseconds=200),
    )


class RunningConsumer:
    """A MembershipConsumer polling on a background thread until `close()`."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        self.metrics = Metrics()
        self.consumer, self.producer = build_consumer(
            settings,
            metrics=self.metrics,
            client_id=f"rm-test-{uuid.uuid4().hex[:6]}",
            **kwargs,
        )
        self.stop = GracefulShutdown()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="membership-consumer")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.consumer.run(self.stop)
        except BaseException as exc:
            self.error = exc

    def value(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def total(self, name: str) -> float:
        """Sum of a counter over all its label values."""
        return sum(
            sample.value
            for metric in self.metrics.registry.collect()
            for sample in metric.samples
            if sample.name == name
        )

    @property
    def handled(self) -> float:
        return (
            self.total("rewards_membership_applied_total")
            + self.total("rewards_membership_skipped_stale_total")
            + self.total("rewards_membership_skipped_duplicate_total")
            + self.total("rewards_identity_membership_dlq_total")
        )

    def wait_handled(self, count: int, *, timeout: float = 60.0) -> None:
        wait_until(
            lambda: self.error is not None or self.handled >= count,
            timeout=timeout,
            what=f"{count} messages handled (have {self.handled})",
        )
        assert self.error is None, self.error

    def close(self) -> None:
        self.stop.request("test finished")
        self._thread.join(60)
        assert not self._thread.is_alive(), "consumer did not stop"
        self.producer.flush(10)
        assert self.error is None, self.error


@pytest.fixture
def start_consumer(settings: Settings) -> Iterator[Callable[..., RunningConsumer]]:
    running: list[RunningConsumer] = []

    def start(*, tracer: Any = None, **overrides: Any) -> RunningConsumer:
        chosen = msgspec.structs.replace(settings, **overrides) if overrides else settings
        consumer = RunningConsumer(chosen, tracer=tracer)
        running.append(consumer)
        return consumer

    yield start
    for consumer in running:
        if consumer._thread.is_alive():
            consumer.close()


Row = dict[str, Any]


@pytest.fixture
def rows(database: str) -> Callable[..., list[Row]]:
    def fetch(where: LiteralString = "true", params: dict[str, Any] | None = None) -> list[Row]:
        with psycopg.connect(database) as conn:
            cursor = conn.execute(
                "SELECT * FROM rewards.agent_performance WHERE "
                + where
                + " ORDER BY agent_user_id, company_id",
                params or {},
            )
            names = [c.name for c in cursor.description or ()]
            return [dict(zip(names, r, strict=True)) for r in cursor]

    return fetch


@pytest.fixture
def sql(database: str) -> Callable[..., list[tuple[Any, ...]]]:
    def run(
        statement: LiteralString, params: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        with psycopg.connect(database) as conn:
            cursor = conn.execute(statement, params or {})
            return cursor.fetchall() if cursor.description else []

    return run


@pytest.fixture
def states(
    sql: Callable[..., list[tuple[Any, ...]]],
) -> Callable[..., list[tuple[Any, ...]]]:
    """`states()` / `states(agent)`: (membership_status, last_membership_version, version) of
    every projection row, or of the agent's rows: what an ordering or retry test checks."""

    def read(agent: uuid.UUID | None = None) -> list[tuple[Any, ...]]:
        return sql(
            "SELECT membership_status, last_membership_version, version"
            " FROM rewards.agent_performance"
            " WHERE %(agent)s::uuid IS NULL OR agent_user_id = %(agent)s",
            {"agent": agent},
        )

    return read


@pytest.fixture
def locked_row(
    database: str, sql: Callable[..., list[tuple[Any, ...]]]
) -> Iterator[Callable[[uuid.UUID, uuid.UUID], psycopg.Connection[Any]]]:
    """`locked_row(agent, company)`: the pair's projection row, Active at version 1 (as its
    first event left it), locked FOR UPDATE by another session (an operator's open
    transaction) until `.rollback()` on the session returned; closed after the test."""
    blockers: list[psycopg.Connection[Any]] = []

    def lock(agent: uuid.UUID, company: uuid.UUID) -> psycopg.Connection[Any]:
        sql(
            "INSERT INTO rewards.agent_performance (agent_user_id, company_id,"
            " membership_status, last_membership_version, version)"
            " VALUES (%(a)s, %(c)s, 'Active', 1, 1)",
            {"a": agent, "c": company},
        )
        blocker = psycopg.connect(database)
        blockers.append(blocker)
        blocker.execute(
            "SELECT 1 FROM rewards.agent_performance WHERE agent_user_id = %s FOR UPDATE", (agent,)
        )
        return blocker

    yield lock
    for blocker in blockers:
        blocker.close()


@pytest.fixture
def stream() -> Callable[..., list[AgentMembershipChanged]]:
    """`stream(agents=, versions=)`: per agent (one agency) versions 1..n, alternating Active
    / Left, so every event applies."""

    def build(agents: int, versions: int) -> list[AgentMembershipChanged]:
        company = uuid.uuid4()
        payloads = []
        for agent in (uuid.uuid4() for _ in range(agents)):
            for version in range(1, versions + 1):
                left = version % 2 == 0
                status, reason = ("Left", "SelfLeave") if left else ("Active", None)
                payloads.append(membership(agent, company, version, status, reason=reason))
        return payloads

    return build


@pytest.fixture
def assert_applied_once_each(
    sql: Callable[..., list[tuple[Any, ...]]],
) -> Callable[[list[AgentMembershipChanged]], None]:
    """`assert_applied_once_each(payloads)`: every event has its inbox mark and was applied
    exactly once (a row's version is +1 per applied change: equal to its event count)."""

    def check(payloads: list[AgentMembershipChanged]) -> None:
        (marks,) = sql("SELECT count(*) FROM rewards.inbox")[0]
        assert marks == len(payloads)
        expected = Counter((p.agent_user_id, p.company_id) for p in payloads)
        found = {
            (a, c): (version, last)
            for a, c, version, last in sql(
                "SELECT agent_user_id, company_id, version, last_membership_version"
                " FROM rewards.agent_performance"
            )
        }
        assert found == {key: (n, n) for key, n in expected.items()}

    return check


@pytest.fixture
def kit(  # noqa: PLR0917 - the fixtures it groups
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    start_consumer: Callable[..., RunningConsumer],
    event: Callable[..., AgentMembershipChanged],
    raw: Callable[..., bytes],
    sql: Callable[..., list[tuple[Any, ...]]],
    settings: Settings,
    wait: Callable[..., float],
) -> ConsumerKit:
    return ConsumerKit(
        kafka_bootstrap, kafka_topic, start_consumer, event, raw, sql, settings, wait
    )
