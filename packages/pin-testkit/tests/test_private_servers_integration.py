"""A private PostgreSQL + Kafka pair: stopped and started again on the same ports with the
same data, and gone after close (the end-to-end suite's outages stand on this)."""

from __future__ import annotations

import psycopg
import pytest

from pin_runtime.errors import KafkaUnreachableError
from pin_runtime.kafka import verify_connection
from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.state import PG_PORT_ENV
from pin_testkit.private_servers import PrivateServers

pytestmark = pytest.mark.integration


def test_servers_stop_come_back_with_their_data_and_are_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A port pinned for the shared servers must not be taken for the private pair.
    monkeypatch.setenv(PG_PORT_ENV, "5432")
    with PrivateServers.launch(prefix="pin-private-servers-test-") as servers:
        services = servers.services
        assert servers.state_dir.name.startswith("pin-private-servers-test-")
        assert (servers.state_dir / "kafka" / "libs").is_symlink()  # the jars are shared
        assert services.pg_port != 5432
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v int)")
            conn.execute("INSERT INTO kept VALUES (7)")

        assert servers.stop_kafka() > 0
        assert servers.stopped == {"kafka"}
        with pytest.raises(KafkaUnreachableError):
            verify_connection({"bootstrap.servers": services.kafka_bootstrap}, timeout=2)
        servers.stop_postgres()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(services.postgres_dsn, connect_timeout=2).close()
        with pytest.raises(LocalInfraError, match="was not running"):
            servers.stop_postgres()

        servers.restart_stopped()
        assert servers.stopped == set()
        verify_connection({"bootstrap.servers": services.kafka_bootstrap}, timeout=30)
        with psycopg.connect(services.postgres_dsn) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [(7,)]
    assert not servers.state_dir.exists()
