"""Any environment an operator could write, for every process kind of identity-fanout: each
setting is refused at start with one line naming it, or taken by what consumes it.

`pin_testkit.settings_fuzz` draws the environments and checks each refusal (exit-2 line,
the variable, no secret). An accepted one must then start: PostgreSQL takes its session
(the options of `SessionLimits`, on a real server as the worker's login) and librdkafka
takes the relay's producer settings (the relay makes its producer as it is made).
"""

from __future__ import annotations

from typing import Final

import pytest
from prometheus_client import CollectorRegistry

from identity_fanout.app import outbox_relay
from identity_fanout.settings import ENV_PREFIX, LagWatchSettings, Settings
from pin_runtime.postgres import connect
from pin_testkit.settings_fuzz import SECRET, check_every_setting

pytestmark = pytest.mark.integration

BASE: Final = {
    "IDENTITY_FANOUT_DATABASE_DSN": f"host=127.0.0.1 port=1 dbname=x password={SECRET}",
    "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    "IDENTITY_FANOUT_KAFKA_SASL_PASSWORD": SECRET,
}


def test_every_setting_of_the_worker_and_the_relay_is_refused_or_taken(worker_dsn: str) -> None:
    def starts(taken: Settings) -> None:
        # The server took every option as the session started (a drawn statement timeout
        # of 1 ms is valid, and may cancel any statement: none is run here).
        with connect(worker_dsn, taken.database_session()) as conn:
            assert conn.info.parameter_status("TimeZone") == "UTC"
        if not taken.kafka_bootstrap.strip() or taken.unreadable_tls_file() is not None:
            return  # the relay's start refuses it (kafka_or_exit: exit 2)
        # The producer is made by the relay's constructor: librdkafka checks it there.
        outbox_relay(taken, registry=CollectorRegistry()).close()

    check_every_setting(Settings, ENV_PREFIX, BASE, starts)


def test_every_setting_of_the_lag_watcher_is_refused_or_taken() -> None:
    base = {"IDENTITY_FANOUT_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    check_every_setting(LagWatchSettings, ENV_PREFIX, base)
