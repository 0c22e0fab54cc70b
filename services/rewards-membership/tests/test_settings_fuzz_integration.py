"""Any environment an operator could write, for every process kind of rewards-membership:
each setting is refused at start with one line naming it, or taken by what consumes it.

`pin_testkit.settings_fuzz` draws the environments and checks each refusal (exit-2 line,
the variable, no secret). An accepted one must then start: PostgreSQL takes its session (on
a real server, as the consumer's login) and librdkafka takes the consumer's three clients
(the group member, its offsets reader and the DLQ producer, made as `consume` makes them).
"""

from __future__ import annotations

from typing import Final

import pytest

from pin_runtime.postgres import connect
from pin_testkit.settings_fuzz import SECRET, check_every_setting
from rewards_membership.app import build_consumer
from rewards_membership.settings import ENV_PREFIX, LagWatchSettings, Settings

pytestmark = pytest.mark.integration

BASE: Final = {
    "REWARDS_MEMBERSHIP_DATABASE_DSN": f"host=127.0.0.1 port=1 dbname=x password={SECRET}",
    "REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    "REWARDS_MEMBERSHIP_KAFKA_SASL_PASSWORD": SECRET,
}


def test_every_setting_of_the_consumer_is_refused_or_taken(consumer_dsn: str) -> None:
    def starts(taken: Settings) -> None:
        # The server took every option as the session started (a drawn statement timeout
        # of 1 ms is valid, and may cancel any statement: none is run here).
        with connect(consumer_dsn, taken.database_session()) as conn:
            assert conn.info.parameter_status("TimeZone") == "UTC"
        if not taken.kafka_bootstrap.strip() or taken.unreadable_tls_file() is not None:
            return  # `consume` refuses it as it starts (kafka_or_exit: exit 2)
        consumer, producer = build_consumer(taken)
        consumer.close()
        producer.flush(0)

    check_every_setting(Settings, ENV_PREFIX, BASE, starts)


def test_every_setting_of_the_lag_watcher_is_refused_or_taken() -> None:
    base = {"REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    check_every_setting(LagWatchSettings, ENV_PREFIX, base)
