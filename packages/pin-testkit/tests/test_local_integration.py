"""The launcher against the real programs: PostgreSQL binaries, Java, Maven, Kafka's jars.

Runs in its own state directory (own ports, own data) and stops everything afterwards, so it
neither needs nor disturbs a developer's ``pin-local up``.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from pin_runtime.errors import KafkaSetupError
from pin_runtime.kafka import verify_connection
from pin_testkit.local import catalogue_topics, down, ensure_up, status
from pin_testkit.local.state import KAFKA_CONTROLLER_PORT_ENV, KAFKA_PORT_ENV, PG_PORT_ENV
from pin_testkit.ports import listens
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def state_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in (PG_PORT_ENV, KAFKA_PORT_ENV, KAFKA_CONTROLLER_PORT_ENV):
        monkeypatch.delenv(name, raising=False)
    # Not under pytest's tmp_path: as root, PostgreSQL runs as `postgres`, which cannot enter
    # /tmp/pytest-of-root (mode 700).
    path = Path(tempfile.mkdtemp(prefix="pin-local-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        down(state_dir=path)
        shutil.rmtree(path, ignore_errors=True)


def _topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_ensure_up_reuses_restarts_and_stops(state_dir: Path) -> None:
    first = ensure_up(state_dir=state_dir)
    second = ensure_up(state_dir=state_dir)
    assert second == first
    assert first.kafka_bootstrap == f"127.0.0.1:{first.kafka_port}"

    for dsn in (first.postgres_dsn, first.identity_dsn, first.rewards_dsn):
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT current_database(), current_user").fetchone()
            assert row is not None
            assert row[0] == dsn.rsplit("/", 1)[1]
    with psycopg.connect(first.identity_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    assert {spec[0] for spec in catalogue_topics()} <= _topics(first.kafka_bootstrap)

    # A broker that died is restarted on the same port with the same data; PostgreSQL is reused.
    before = status(state_dir=state_dir)
    assert before.up
    assert before.kafka.pid is not None
    os.kill(before.kafka.pid, signal.SIGKILL)
    # A killed JVM closes its listeners as it exits, a moment after the signal: until then its
    # ports are held, and a restart would rightly refuse them as another process's.
    wait_until(lambda: not listens(first.kafka_port), 30, "the killed broker's listener is closed")
    third = ensure_up(state_dir=state_dir)
    assert third == first
    after = status(state_dir=state_dir)
    assert after.up
    assert after.kafka.pid != before.kafka.pid
    assert after.postgres.pid == before.postgres.pid
    assert {spec[0] for spec in catalogue_topics()} <= _topics(third.kafka_bootstrap)

    down(state_dir=state_dir)
    down(state_dir=state_dir)  # idempotent
    stopped = status(state_dir=state_dir)
    assert not stopped.postgres.answering
    assert not stopped.kafka.answering
    assert stopped.kafka.pid is None

    # Both come back with their data.
    assert ensure_up(state_dir=state_dir) == first
    with psycopg.connect(first.identity_dsn) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [(7,)]


def test_secure_mode_is_added_to_a_running_broker_and_kept(state_dir: Path) -> None:
    plain = ensure_up(state_dir=state_dir)
    assert plain.secured is None
    # Switched on for a storage formatted without it: the broker restarts with the secured
    # listeners and the SCRAM user is created through kafka-configs.
    secure = ensure_up(state_dir=state_dir, secure=True)
    secured = secure.secured
    assert secured is not None
    assert secure.kafka_bootstrap == plain.kafka_bootstrap
    verify_connection(secured.sasl_config(), timeout=30)
    verify_connection(secured.sasl_config(**{"sasl.mechanism": "SCRAM-SHA-256"}), timeout=30)
    verify_connection(secured.mtls_config(), timeout=30)
    with pytest.raises(KafkaSetupError, match="authentication failed"):
        verify_connection(secured.sasl_config(**{"sasl.password": "wrong"}), timeout=30)
    pid = status(state_dir=state_dir).kafka.pid
    # A later plain `up` keeps secure mode (same files, same password) and reuses the broker.
    again = ensure_up(state_dir=state_dir)
    assert again.secured == secured
    assert status(state_dir=state_dir).kafka.pid == pid
