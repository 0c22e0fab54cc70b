"""A projection row locked elsewhere stalls its own partition, not the others.

Real PostgreSQL and Kafka. One row of `rewards.agent_performance` is held `FOR UPDATE` by
another session (an operator's open transaction) while records arrive on all three
partitions: after one lock timeout the other partitions' records are applied and go on
flowing, the locked partition is paused (and shown in `/readyz`, `status --json` and the
paused-by-reason gauge) until the lock goes; then every record is applied exactly once.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from confluent_kafka import TopicPartition
from consumer_kit import record_of

from pin_contracts import envelope_for
from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.http import OpsServer
from pin_runtime.kafka import create_consumer
from rewards_membership.cli import main
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

Event = Callable[..., Any]
Sql = Callable[..., list[tuple[Any, ...]]]
LOCK_TIMEOUT = 2.0


def send(kafka: Any, records: list[tuple[int, Any]]) -> None:
    """(partition, payload) each, in an envelope of its own, keyed by its agent as the relay
    keys it, on that partition; every record acknowledged."""
    tracker = DeliveryTracker[int]()
    for partition, payload in records:
        key, value, headers = record_of(envelope_for(payload))
        kafka.producer.produce(
            kafka.topic,
            partition=partition,
            key=key,
            value=value,
            headers=headers or [],
            on_delivery=tracker,
        )
    flush_or_raise(kafka.producer, 30.0, tracker)


def committed(settings: Settings) -> dict[int, int]:
    reader = create_consumer(settings.kafka_bootstrap, group_id=settings.group_id, client_id="c")
    try:
        tps = [TopicPartition(settings.topic, p) for p in range(3)]
        return {tp.partition: tp.offset for tp in reader.committed(tps, timeout=10)}
    finally:
        reader.close()


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, msgspec.json.decode(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, msgspec.json.decode(error.read())


def status_json(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    settings: Settings,
    dsn: str,
) -> dict[str, Any]:
    values = {
        "DATABASE_DSN": dsn,
        "KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOPIC": settings.topic,
        "DLQ_TOPIC": settings.dlq_topic,
        "GROUP_ID": settings.group_id,
    }
    for name, value in values.items():
        monkeypatch.setenv(f"REWARDS_MEMBERSHIP_{name}", value)
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    answer: dict[str, Any] = msgspec.json.decode(capsys.readouterr().out)
    return answer


PAUSED = "rewards_membership_paused_partitions_by_reason"


def assert_rows(sql: Sql, locked_agent: uuid.UUID, total: int) -> None:
    """Every record has its inbox mark; each other agent's row took each of its events once
    (version +1 per applied change): 11 agents of one event, 10 of three."""
    (marks,) = sql("SELECT count(*) FROM rewards.inbox")[0]
    assert marks == total
    versions = sql(
        "SELECT version, last_membership_version FROM rewards.agent_performance"
        " WHERE agent_user_id <> %s",
        (locked_agent,),
    )
    assert sorted(versions) == sorted([(1, 1)] * (5 + 6) + [(3, 3)] * 10)


def assert_shown_paused(consumer: Any, port: int, wait: Callable[..., float]) -> None:
    """Partition 0 alone paused for the lock: in the gauges and in `/readyz` (200). It is
    retried about every second (resumed for a moment), so each is awaited."""
    wait(
        lambda: (
            consumer.consumer.paused_partitions == {0}
            and consumer.value(PAUSED, reason="lock_timeout") == 1
            and consumer.value(PAUSED, reason="postgresql") == 0
            and consumer.value("rewards_membership_paused_partitions") == 1
        ),
        what="partition 0 alone paused for the lock, in the gauges",
    )
    shown: list[dict[str, Any]] = []

    def listed() -> bool:
        code, body = readyz(port)
        assert code == 200, body  # serving the other partitions
        assert body["checks"]["postgresql"]["status"] == "ok"
        shown[:] = body["checks"]["partitions"]["paused"]
        return bool(shown)

    wait(listed, what="/readyz lists the paused partition")
    [paused] = shown
    assert (paused["partition"], paused["reason"]) == (0, "lock_timeout")
    assert paused["since"] <= paused["retry_at"]
    assert paused["attempts"] >= 1


def test_a_locked_row_pauses_its_partition_alone_within_one_lock_timeout(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    sql: Sql,
    states: Sql,
    locked_row: Callable[[uuid.UUID, uuid.UUID], psycopg.Connection[Any]],
    settings: Settings,
    operator_dsn: str,
    wait: Callable[..., float],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    company = uuid.uuid4()
    locked_agent = uuid.uuid4()
    blocker = locked_row(locked_agent, company)  # Active at version 1, locked FOR UPDATE
    # Partition 0: the locked row's event, then others behind it (they wait with it: per
    # partition order). Partitions 1 and 2: events of other agents, 3 versions each.
    behind = [event(uuid.uuid4(), company, 1) for _ in range(5)]
    others = {
        p: [event(a, company, v) for a in (uuid.uuid4() for _ in range(5)) for v in (1, 2, 3)]
        for p in (1, 2)
    }
    records = [
        (0, event(locked_agent, company, 2, "Left", reason="SelfLeave")),
        *((0, e) for e in behind),
        *((p, e) for p in (1, 2) for e in others[p]),
    ]
    send(kafka, records)  # all there before the consumer's first poll: one batch of all three
    consumer = start_consumer(db_lock_timeout=timedelta(seconds=LOCK_TIMEOUT))
    ops = OpsServer(
        registry=consumer.metrics.registry, checks=consumer.consumer.readiness_checks()
    ).start("127.0.0.1", 0)

    def applied(agents: list[Any]) -> int:
        ids = [e.agent_user_id for e in agents]
        (count,) = sql(
            "SELECT count(*) FROM rewards.agent_performance WHERE agent_user_id = ANY(%s)",
            (ids,),
        )[0]
        return int(count)

    try:
        wait(
            lambda: (
                consumer.value("rewards_membership_retries_total", dependency="postgresql") >= 1
            ),
            timeout=30,
            what="the batch holding the locked row failed on the lock timeout",
        )
        failed = time.monotonic()
        # The other partitions go on within the same lock timeout: their records are in
        # the database well before a second lock timeout could have passed.
        wait(
            lambda: applied(others[1] + others[2]) == 10,
            timeout=LOCK_TIMEOUT * 0.75,
            what="partitions 1 and 2 applied after one lock timeout",
        )
        assert time.monotonic() - failed < LOCK_TIMEOUT
        assert applied(behind) == 0  # behind the locked record, in order
        assert states(locked_agent) == [("Active", 1, 1)]

        # The locked partition alone is paused, and shows.
        assert_shown_paused(consumer, ops.port, wait)
        [noted] = status_json(capsys, monkeypatch, settings, operator_dsn)["paused"]
        assert (noted["partition"], noted["cause"], noted["dependency"]) == (
            0,
            "lock_timeout",
            "postgresql",
        )
        assert "LockNotAvailable" in noted["reason"]

        # While the lock is held (and partition 0 retried again and again), new records of
        # the other partitions still flow, each well within a lock timeout.
        for round_ in range(3):
            more = [event(uuid.uuid4(), company, 1) for _ in range(2)]
            sent = time.monotonic()
            send(kafka, [(1 + round_ % 2, e) for e in more])
            wait(lambda more=more: applied(more) == 2, what=f"round {round_} applied")
            assert time.monotonic() - sent < LOCK_TIMEOUT, "a retry of the locked partition"
            others[1 + round_ % 2].extend(more)
        # Partition 0 was retried meanwhile (resumed, its part tried apart, paused again).
        assert consumer.value("rewards_membership_retries_total", dependency="postgresql") > 1
        wait(lambda: consumer.consumer.paused_partitions == {0}, what="partition 0 paused")
        assert applied(behind) == 0

        blocker.rollback()
        total = len(records) + 6
        consumer.wait_handled(total, timeout=60)
        wait(lambda: consumer.consumer.paused_partitions == frozenset(), what="resumed")
        assert consumer.value(PAUSED, reason="lock_timeout") == 0
        assert readyz(ops.port)[1]["checks"]["partitions"] == {"status": "ok", "paused": []}
        assert status_json(capsys, monkeypatch, settings, operator_dsn)["paused"] == []
    finally:
        ops.stop()
    # Exactly once: every record reported once, applied once, committed.
    assert consumer.handled == total
    assert consumer.total("rewards_membership_applied_total") == total
    assert consumer.total("rewards_membership_skipped_duplicate_total") == 0
    consumer.close()
    assert sum(committed(settings).values()) == total
    assert states(locked_agent) == [("Left", 2, 2)]
    assert_rows(sql, locked_agent, total)
