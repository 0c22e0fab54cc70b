"""Toxiproxy in front of the real PostgreSQL: latency, a cut, a reset mid-transaction, heal."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import KafkaError, Producer
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pin_runtime.kafka import create_admin, ensure_topics
from pin_testkit.local.toxiproxy import Proxy, ToxiproxyServer
from pin_testkit.private import PrivateKafka

# Real servers started here (Toxiproxy, a private broker, Prometheus): not a unit test.
pytestmark = pytest.mark.integration


@pytest.fixture
def toxiproxy(tmp_path: Path) -> Iterator[ToxiproxyServer]:
    with ToxiproxyServer(tmp_path / "toxiproxy") as server:
        yield server


@pytest.fixture
def pg_proxy(toxiproxy: ToxiproxyServer, fresh_database: str) -> tuple[Proxy, str]:
    params = conninfo_to_dict(fresh_database)
    proxy = toxiproxy.proxy("postgres", f"{params.get('host', '127.0.0.1')}:{params['port']}")
    proxied = make_conninfo(fresh_database, host="127.0.0.1", port=proxy.port, connect_timeout=3)
    return proxy, proxied


def test_a_proxied_connection_passes_then_feels_the_latency(pg_proxy: tuple[Proxy, str]) -> None:
    proxy, dsn = pg_proxy
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        toxic = proxy.add_toxic("latency", latency=300)
        started = time.monotonic()
        conn.execute("SELECT 1")
        assert time.monotonic() - started >= 0.3
        proxy.remove_toxic(toxic)
        assert proxy.toxics() == []


def test_a_cut_refuses_new_connections_until_healed(pg_proxy: tuple[Proxy, str]) -> None:
    proxy, dsn = pg_proxy
    proxy.disable()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn)
    proxy.heal()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_reset_mid_transaction_breaks_that_session_and_commits_nothing(
    pg_proxy: tuple[Proxy, str], fresh_database: str
) -> None:
    proxy, dsn = pg_proxy
    with psycopg.connect(fresh_database, autocommit=True) as direct:
        direct.execute("CREATE TABLE t (n int)")
    conn = psycopg.connect(dsn)
    conn.execute("INSERT INTO t VALUES (1)")
    proxy.add_toxic("reset_peer", stream="upstream", timeout=0)
    with pytest.raises(psycopg.OperationalError):
        conn.commit()
    conn.close()
    proxy.heal()
    with psycopg.connect(dsn) as after:
        assert after.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_broker_behind_a_proxy_is_cut_off_and_healed(toxiproxy: ToxiproxyServer) -> None:
    with PrivateKafka.launch(proxied=2) as broker:
        listener, other = broker.proxied
        proxy = toxiproxy.proxy("kafka", listener.upstream, port=listener.advertised_port)
        untouched = toxiproxy.proxy("kafka-2", other.upstream, port=other.advertised_port)
        topic = f"proxied-{uuid.uuid4().hex[:8]}"
        ensure_topics(create_admin(broker.bootstrap, client_id="toxiproxy-test"), [(topic, 1)])

        def deliver(timeout_ms: int, via: str = listener.bootstrap) -> list[KafkaError | None]:
            producer = Producer({"bootstrap.servers": via, "message.timeout.ms": timeout_ms})
            outcomes: list[KafkaError | None] = []
            producer.produce(topic, b"v", on_delivery=lambda e, _m: outcomes.append(e))
            producer.flush(timeout_ms / 1000 + 5)
            return outcomes

        assert deliver(10_000) == [None]
        proxy.disable()
        [cut] = deliver(2_000)
        assert cut is not None
        assert cut.code() == KafkaError._MSG_TIMED_OUT
        assert broker.answers()  # only the proxied path was cut
        assert deliver(10_000, via=other.bootstrap) == [None]  # another process's path too
        assert untouched.toxics() == []
        proxy.heal()
        assert deliver(10_000) == [None]
