"""``private_kafka``: a broker of the test's own that goes away and comes back with its data."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from pin_testkit.private import OWNER_FILE, STATE_PREFIX, PrivateKafka, sweep_orphans

pytestmark = pytest.mark.integration


def producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
            # A stopped broker must surface as a failed delivery within the test's patience.
            "message.timeout.ms": 2000,
        }
    )


def produce(client: Producer, topic: str, value: bytes, timeout: float = 30.0) -> KafkaError | None:
    """Produce one record and wait for its delivery report: its error, or None."""
    reports: list[KafkaError | None] = []
    client.produce(topic, value=value, on_delivery=lambda error, _msg: reports.append(error))
    deadline = time.monotonic() + timeout
    while not reports and time.monotonic() < deadline:
        client.flush(min(1.0, max(0.0, deadline - time.monotonic())))
    assert reports, f"no delivery report within {timeout}s"
    return reports[0]


def read_all(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """The values of the first ``count`` records of ``topic``, from the beginning."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"private-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(values) < count and (remaining := deadline - time.monotonic()) > 0:
            message: Message | None = consumer.poll(min(remaining, 1.0))
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


def metadata_fails(bootstrap: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=2.0)
    except KafkaException:
        return True
    return False


def test_stop_refuses_clients_and_start_brings_back_the_data(private_kafka: PrivateKafka) -> None:
    topic = private_kafka.create_topic(partitions=1)
    client = producer(private_kafka.bootstrap)
    try:
        assert produce(client, topic, b"before") is None
        bootstrap, pid = private_kafka.bootstrap, private_kafka.pid
        assert pid is not None

        took = private_kafka.stop()
        assert took < 30
        assert not private_kafka.running
        assert private_kafka.refuses_connections()
        assert private_kafka.stop() >= 0  # idempotent
        started = time.monotonic()
        error = produce(client, topic, b"while-down")
        assert error is not None
        assert error.code() == KafkaError._MSG_TIMED_OUT
        assert time.monotonic() - started < 15  # bounded by message.timeout.ms
        assert metadata_fails(bootstrap)

        private_kafka.start()
        assert private_kafka.bootstrap == bootstrap  # same ports
        assert private_kafka.pid not in {None, pid}
        assert private_kafka.answers()
        # The producer that saw the broker die reconnects by itself.
        assert produce(client, topic, b"after") is None
    finally:
        client.close()
    # The record from before the stop survived it; the refused one never arrived.
    assert read_all(private_kafka.bootstrap, topic, 2) == [b"before", b"after"]
    assert private_kafka.start() >= 0  # idempotent while it runs


def test_a_killed_broker_recovers_its_log_and_close_removes_everything() -> None:
    with PrivateKafka.launch() as broker:
        topic = broker.create_topic(partitions=3)
        client = producer(broker.bootstrap)
        try:
            for n in range(10):
                assert produce(client, topic, b"%d" % n) is None
        finally:
            client.close()
        broker.kill()
        assert not broker.running
        assert broker.refuses_connections()
        broker.start()
        assert sorted(read_all(broker.bootstrap, topic, 10)) == sorted(b"%d" % n for n in range(10))
        pid, state_dir = broker.pid, broker.state_dir
        assert pid is not None
        assert state_dir.is_dir()
    assert not broker.running
    assert not state_dir.exists()
    assert broker.refuses_connections()


def test_sweep_removes_state_of_a_dead_owner_only(tmp_path: Path) -> None:
    dead_pid = subprocess.run(  # a process that has exited and been reaped
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    orphan = tmp_path / f"{STATE_PREFIX}orphan"
    mine = tmp_path / f"{STATE_PREFIX}mine"
    being_set_up = tmp_path / f"{STATE_PREFIX}being-set-up"
    for path in (orphan, mine, being_set_up):
        path.mkdir()
    (orphan / OWNER_FILE).write_text(f"{dead_pid}\n", encoding="ascii")
    (mine / OWNER_FILE).write_text(f"{os.getpid()}\n", encoding="ascii")

    assert sweep_orphans(tmp_path) == [orphan]
    assert not orphan.exists()
    assert mine.is_dir()
    assert being_set_up.is_dir()
