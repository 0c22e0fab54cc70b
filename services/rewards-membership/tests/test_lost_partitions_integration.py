"""Partitions lost, not revoked: a consumer cut off from the broker beyond its session.

The group gives its partitions to another member without asking it; when the path comes
back, librdkafka reports them lost (`on_lost`). The lost member must finish the batch in
flight without committing anything of those partitions (another member owns them now), and
between the two members every event is applied exactly once (the inbox and the version
guard absorb the redelivered batch).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from consumer_kit import publish

from pin_runtime.kafka import create_producer
from pin_testkit.local.toxiproxy import ToxiproxyServer
from pin_testkit.private import PrivateKafka

pytestmark = pytest.mark.integration

Event = Callable[..., Any]
Sql = Callable[..., list[tuple[Any, ...]]]
SESSION = timedelta(seconds=6)  # the broker's group.min.session.timeout.ms


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[PrivateKafka, ToxiproxyServer]]:
    with (
        ToxiproxyServer(tmp_path / "toxiproxy") as toxiproxy,
        PrivateKafka.launch(proxied=1) as kafka,
    ):
        yield kafka, toxiproxy


def test_a_member_cut_off_beyond_its_session_loses_its_partitions_and_nothing_else(
    *,
    broker: tuple[PrivateKafka, ToxiproxyServer],
    start_consumer: Any,
    event: Event,
    sql: Sql,
    wait: Callable[..., float],
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka, toxiproxy = broker
    (listener,) = kafka.proxied
    proxy = toxiproxy.proxy("kafka", listener.upstream, port=listener.advertised_port)
    topic, dlq = kafka.create_topic(partitions=3), kafka.create_topic(partitions=3)
    common = {"topic": topic, "dlq_topic": dlq, "kafka_session_timeout": SESSION}
    producer = create_producer(kafka.bootstrap, client_id="lost-test", linger_ms=1)
    company = uuid.uuid4()
    agents = [uuid.uuid4() for _ in range(60)]
    versions = [
        [
            event(
                a, company, v, "Active" if v % 2 else "Left", reason=None if v % 2 else "SelfLeave"
            )
            for a in agents
        ]
        for v in (1, 2, 3)
    ]

    cut_off = start_consumer(kafka_bootstrap=listener.bootstrap, batch_size=20, **common)
    publish(producer, topic, *versions[0])
    cut_off.wait_handled(len(agents))
    proxy.disable()  # its path to the broker is gone; the broker itself runs on
    publish(producer, topic, *versions[1])
    other = start_consumer(kafka_bootstrap=kafka.bootstrap, batch_size=20, **common)
    # After the session timeout the group gives every partition to the other member.
    wait(
        lambda: len(other.consumer.assigned_partitions) == 3,
        timeout=60,
        what="the other member took every partition over",
    )
    other.wait_handled(len(agents), timeout=60)
    proxy.enable()
    wait(
        lambda: any(r.getMessage() == "partitions lost" for r in caplog.records),
        timeout=60,
        what="the cut-off member told its partitions are lost",
    )
    publish(producer, topic, *versions[2])
    total = 3 * len(agents)
    wait(
        lambda: (
            cut_off.total("rewards_membership_applied_total")
            + other.total("rewards_membership_applied_total")
            >= total
        ),
        timeout=90,
        what="every event applied by one member or the other",
    )
    # Exactly once between the two: each agent's row carries its three versions once.
    rows = sql(
        "SELECT membership_status, leave_reason, last_membership_version, version "
        "FROM rewards.agent_performance"
    )
    assert sorted(rows) == [("Active", None, 3, 3)] * len(agents)
    (inbox,) = sql("SELECT count(*) FROM rewards.inbox")[0]
    assert inbox == total
    applied = sum(c.total("rewards_membership_applied_total") for c in (cut_off, other))
    assert applied == total
    assert cut_off.error is None
    assert other.error is None
