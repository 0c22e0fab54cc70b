"""The composition root of `lag-watch`: the clients, the watcher and its ops server.

On pin-runtime's shape (`long_running`: JSON logs, tracing, signals, `/metrics`, `/healthz`,
`/readyz`), as the services' own long-lived commands: `kafka_or_exit` first (credentials the
brokers refuse: exit 2), then pass after pass until SIGTERM.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from pin_runtime.composition import long_running
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.kafka import LoginRenewal
from pin_runtime.kafka_security import kafka_or_exit
from pin_runtime.lag_watch.brokers import Brokers, open_brokers
from pin_runtime.lag_watch.cli import COMMAND
from pin_runtime.lag_watch.metrics import LagWatchMetrics
from pin_runtime.lag_watch.settings import LagWatchSettings
from pin_runtime.lag_watch.watcher import LagWatcher, WatchPlan
from pin_runtime.logging import log_event
from pin_runtime.settings import settings_for_log, unknown_variables

__all__ = ["longest_pass", "run_lag_watch"]

_log = logging.getLogger(__name__)

# Requests of one kind in flight at once (brokers.py): a pass's slowest path waits one
# request timeout per slice of groups, twice (discovery, then the listed groups).
_GROUPS_PER_SLICE = 32


def longest_pass(settings: LagWatchSettings) -> float:
    """Seconds a pass may take when every request times out: the heartbeat's limit."""
    timeout = settings.lag_watch_request_timeout.total_seconds() + 1.0
    slices = math.ceil(settings.lag_watch_max_groups / _GROUPS_PER_SLICE)
    topics = len(settings.lag_watch_topics)
    return settings.lag_watch_interval.total_seconds() + timeout * (topics + 3 + 2 * slices)


def _renewed(brokers: Brokers, renewal: LoginRenewal) -> Callable[[], bool]:
    """Asked after each pass: the clients' errors served, whether to build them again."""

    def renewed() -> bool:
        brokers.serve_errors()
        return renewal.due()

    return renewed


def run_lag_watch(service: str, prefix: str, settings: LagWatchSettings) -> None:
    """`<service> lag-watch` until SIGTERM/SIGINT."""
    registry = CollectorRegistry()
    metrics = LagWatchMetrics(registry)
    heartbeat = Heartbeat(stale_after=max(60.0, longest_pass(settings) + 30.0))
    with long_running(
        service,
        log_level=settings.log_level,
        metrics_host=settings.metrics_host,
        metrics_port=settings.metrics_port,
        heartbeat=heartbeat,
        registry=registry,
        env_prefix=prefix,
    ) as rt:
        for variable in unknown_variables(type(settings), prefix):
            log_event(_log, "unknown setting ignored", logging.WARNING, variable=variable)
        kafka_or_exit(settings, prefix, command=COMMAND)
        state = ComponentState()
        rt.serve({"kafka": state})
        client = f"{service}-lag-watcher"
        timeout = settings.lag_watch_request_timeout.total_seconds()
        watcher: LagWatcher | None = None
        log_event(_log, "process started", command=COMMAND, settings=settings_for_log(settings))
        try:
            while not rt.stop.is_set():
                # Built again, after a pass, once the brokers refused the login and the SASL
                # password file holds another password (`LoginRenewal`): no restart.
                security = settings.kafka_security()
                renewal = LoginRenewal(security)
                with open_brokers(
                    settings.kafka_bootstrap,
                    client_id=client,
                    security=security,
                    timeout=timeout,
                    on_error=renewal.refused,
                ) as brokers:
                    if watcher is None:
                        watcher = LagWatcher(
                            plan=WatchPlan.of(settings, reader_group=client),
                            brokers=brokers,
                            metrics=metrics,
                            state=state,
                        )
                    else:
                        watcher.brokers = brokers  # its book and gauges go on
                        log_event(_log, "kafka clients rebuilt with the rotated SASL password")
                    watcher.run(rt.stop, rt.heartbeat, until=_renewed(brokers, renewal))
        finally:
            log_event(_log, "process stopped", command=COMMAND)
