"""The composition root of the long-lived processes: `worker` (with the relay) and `relay`.

One function per command builds the world on pin-runtime's shape (`long_running`: logging,
tracing, signals, ops server; then `kafka_or_exit` where the command publishes), then
hands explicit dependencies to the loops. Nothing here is built at import time. It imports
the relay and with it the Kafka client: `cli` imports this module only for these commands.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import CollectorRegistry

from identity_fanout.fanout.metrics import FanoutMetrics
from identity_fanout.fanout.session_name import worker_session_name
from identity_fanout.fanout.worker import FanoutWorker, refused_logins
from identity_fanout.outbox.relay import OutboxRelay
from identity_fanout.schema import OUTBOX_TABLES
from identity_fanout.settings import ENV_PREFIX, SERVICE_NAME, Settings
from pin_runtime.composition import Runtime, collect_less, long_running
from pin_runtime.http import Check, ComponentState, Heartbeat
from pin_runtime.kafka_security import kafka_or_exit
from pin_runtime.logging import log_event
from pin_runtime.postgres import check_login, create_pool
from pin_runtime.settings import settings_for_log

_log = logging.getLogger(__name__)

# A relay thread gets this long after the worker stopped to flush what it has in flight.
RELAY_JOIN_TIMEOUT_SECONDS: Final = 60.0
RELAY_CLIENT_ID: Final = f"{SERVICE_NAME}-relay"
"""The relay producer's client.id, and the prefix of its sessions' application_name."""


def _heartbeat(settings: Settings) -> Heartbeat:
    # Liveness: the loops beat at least every polling interval or half a second.
    return Heartbeat(stale_after=max(60.0, 3 * settings.polling_interval.total_seconds()))


@contextmanager
def runtime(settings: Settings, command: str, *, kafka: bool) -> Iterator[Runtime]:
    """The pin-runtime shape around a long-lived command; `kafka`: it publishes, so the
    brokers must accept its settings before anything starts.

    The caller builds its metrics and readiness checks on `rt.registry` and then calls
    `rt.serve(checks)`: the ops server answers only once every metric and check exists, so
    a scrape after `/readyz` first answers sees each of them (as rewards' consumer does)."""
    with long_running(
        SERVICE_NAME,
        log_level=settings.log_level,
        metrics_host=settings.metrics_host,
        metrics_port=settings.metrics_port,
        env_prefix=ENV_PREFIX,
        heartbeat=_heartbeat(settings),
    ) as rt:
        if kafka:
            kafka_or_exit(settings, ENV_PREFIX, command=command)
        # A refused login exits 2 here, as refused Kafka credentials do; an unreachable
        # server is waited out by the loops.
        check_login(settings.database_dsn.reveal(), settings.database_session())
        # Who holds the database's xmin horizon back (the outbox's head statements are what
        # a held snapshot costs most).
        rt.watch_horizon(settings.database_dsn.reveal(), settings.database_session())
        log_event(_log, "process started", command=command, settings=settings_for_log(settings))
        try:
            yield rt
        finally:
            log_event(_log, "process stopped", command=command)


def outbox_relay(
    settings: Settings,
    *,
    registry: CollectorRegistry,
    state: ComponentState | None = None,
    heartbeat: Heartbeat | None = None,
) -> OutboxRelay:
    """The relay the service's settings describe, on the service's outbox: the one way the
    service builds a relay (the worker's thread, the relay process)."""
    return OutboxRelay(
        settings,
        tables=OUTBOX_TABLES,
        client_id=RELAY_CLIENT_ID,
        registry=registry,
        state=state,
        heartbeat=heartbeat,
    )


def run_relay_process(settings: Settings) -> None:
    """`identity-fanout relay`: the relay alone, with its own ops server, until SIGTERM."""
    # The relay's rows, records and delivery callbacks: with Python's thresholds the
    # collector walked its window again and again (docs/design/identity-fanout.md "The relay
    # process's collector"). The relay's own process only, never the worker's.
    collect_less()
    with runtime(settings, "relay", kafka=True) as rt:
        state = ComponentState()
        relay = outbox_relay(settings, registry=rt.registry, state=state, heartbeat=rt.heartbeat)
        rt.serve({"relay": state})
        relay.run(rt.stop)


def run_worker(settings: Settings, *, with_relay: bool) -> None:
    """The fan-out worker (and, unless disabled, the outbox relay in a thread) until SIGTERM."""
    with runtime(settings, "worker", kafka=with_relay) as rt:
        metrics = FanoutMetrics(rt.registry)
        database = ComponentState()
        checks: dict[str, Check] = {"database": database}
        relay_thread = None
        if with_relay:
            # No heartbeat: liveness stays the worker loop's, which a busy relay must not mask.
            relay_state = checks["relay"] = ComponentState()
            relay = outbox_relay(settings, registry=rt.registry, state=relay_state)
            relay_thread = threading.Thread(target=relay.run, args=(rt.stop,), name="outbox-relay")
        rt.serve(checks)
        if relay_thread is not None:
            relay_thread.start()
        pool = create_pool(
            settings.database_dsn.reveal(),
            name="identity-fanout-worker",
            # Every session of this worker process carries its name: `status` counts them.
            application_name=worker_session_name(),
            min_size=1,
            max_size=settings.db_pool_size,
            session=settings.database_session(),
            on_refused=refused_logins(settings.database_dsn.reveal(), metrics),
        )
        pool.open(wait=False)
        try:
            FanoutWorker(
                settings,
                pool=pool,
                metrics=metrics,
                stop=rt.stop,
                database=database,
                heartbeat=rt.heartbeat,
            ).run()
        finally:
            rt.stop.set()
            if relay_thread is not None:
                relay_thread.join(RELAY_JOIN_TIMEOUT_SECONDS)
            pool.close()
