"""Building and running the long-lived processes: `worker` (with the relay) and `relay`.

One function builds the world (settings -> logging, tracing, metrics, ops server, pool),
then hands explicit dependencies to the loops. Nothing here is built at import time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from prometheus_client import CollectorRegistry

from identity_fanout.metrics import FanoutMetrics
from identity_fanout.settings import SERVICE_NAME, Settings
from identity_fanout.worker import FanoutWorker, WorkerConfig
from pin_runtime.http import ComponentState, Heartbeat, OpsServer
from pin_runtime.logging import configure_logging, log_event
from pin_runtime.postgres import create_pool
from pin_runtime.settings import settings_for_log
from pin_runtime.shutdown import GracefulShutdown
from pin_runtime.tracing import configure_tracing, shutdown_tracing

_log = logging.getLogger(__name__)

# A relay thread gets this long after the worker stopped to flush what it has in flight.
RELAY_JOIN_TIMEOUT_SECONDS: Final = 60.0


class Runtime:
    """What every long-lived command of the service shares."""

    def __init__(self, settings: Settings, stop: threading.Event) -> None:
        self.settings = settings
        self.stop = stop
        self.registry = CollectorRegistry()
        # Liveness: the loops beat at least every polling interval or half a second.
        stale_after = max(60.0, 3 * settings.polling_interval.total_seconds())
        self.heartbeat = Heartbeat(stale_after=stale_after)
        self.ops = OpsServer(registry=self.registry, heartbeat=self.heartbeat)


@contextmanager
def runtime(settings: Settings, command: str) -> Iterator[Runtime]:
    """Logging, tracing, signals and the ops HTTP server around a long-lived command."""
    configure_logging(settings.log_level, service=SERVICE_NAME)
    provider = configure_tracing(SERVICE_NAME)
    stop = threading.Event()
    rt = Runtime(settings, stop)
    with GracefulShutdown() as shutdown:
        shutdown.add_callback(stop.set)
        rt.ops.start(settings.metrics_host, settings.metrics_port)
        log_event(_log, "process started", command=command, settings=settings_for_log(settings))
        try:
            yield rt
        finally:
            rt.ops.stop()
            shutdown_tracing(provider)
            log_event(_log, "process stopped", command=command)


def run_worker(
    settings: Settings, *, with_relay: bool, relay: Callable[[Runtime], None] | None = None
) -> None:
    """The fan-out worker (and, unless disabled, the outbox relay in a thread) until SIGTERM."""
    with runtime(settings, "worker") as rt:
        metrics = FanoutMetrics(rt.registry)
        database = ComponentState()
        rt.ops.add_check("database", database)
        relay_thread = None
        if with_relay and relay is not None:
            relay_thread = threading.Thread(target=relay, args=(rt,), name="outbox-relay")
            relay_thread.start()
        pool = create_pool(
            settings.database_dsn.reveal(),
            name="identity-fanout-worker",
            min_size=1,
            max_size=settings.db_pool_size,
            session=settings.database_session(),
        )
        pool.open(wait=False)
        try:
            FanoutWorker(
                pool=pool,
                listen_dsn=settings.database_dsn.reveal(),
                session=settings.database_session(),
                config=WorkerConfig(
                    batch_size=settings.batch_size,
                    polling_interval=settings.polling_interval,
                    max_lease_duration=settings.max_lease_duration,
                    max_attempts=settings.max_attempts,
                    shard_size=settings.shard_size,
                ),
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
