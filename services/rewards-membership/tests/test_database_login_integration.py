"""A database password rotated under a running consumer: the refused login is logged as such,
counted and paged on (rewards_membership_auth_failures_total{dependency="postgresql"}), and
the consumer applies again once its password file holds the new password, with no restart.
On a real PostgreSQL whose pg_hba.conf checks the passwords of `pin_password_auth`'s members."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from consumer_kit import publish
from psycopg.conninfo import conninfo_to_dict

from pin_contracts import AgentMembershipStatus
from pin_runtime.kafka import create_producer
from pin_testkit.password_logins import PasswordLogin, password_login
from pin_testkit.ports import free_port
from pin_testkit.service import ServiceProcess, service_environment
from pin_testkit.waiting import wait_until
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

PASSWORD = "first-Secret-1"
ROTATED = "second-Secret-2"
COUNTER = "rewards_membership_auth_failures_total"


@pytest.fixture
def login(postgres_admin_dsn: str, consumer_dsn: str) -> Iterator[PasswordLogin]:
    with password_login(postgres_admin_dsn, consumer_dsn, PASSWORD) as made:
        yield made


def logged(text: str, event: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def test_a_consumer_whose_password_is_rotated_under_it_says_so_counts_it_and_recovers(
    *,
    login: PasswordLogin,
    settings: Settings,
    kafka: Any,
    event: Callable[..., Any],
    rows: Callable[..., list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    secret = tmp_path / "database-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o640)
    port = free_port()
    env = service_environment(
        ("REWARDS_MEMBERSHIP_",),
        REWARDS_MEMBERSHIP_DATABASE_DSN=login.dsn(),
        REWARDS_MEMBERSHIP_DATABASE_PASSWORD_FILE=str(secret),
        REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        REWARDS_MEMBERSHIP_TOPIC=settings.topic,
        REWARDS_MEMBERSHIP_DLQ_TOPIC=settings.dlq_topic,
        REWARDS_MEMBERSHIP_GROUP_ID=settings.group_id,
        REWARDS_MEMBERSHIP_POLL_TIMEOUT="200ms",
        REWARDS_MEMBERSHIP_METRICS_HOST="127.0.0.1",
        REWARDS_MEMBERSHIP_METRICS_PORT=str(port),
    )
    writer = create_producer(settings.kafka_bootstrap, client_id="login-test")
    consumer = ServiceProcess(
        "consume", "rewards-membership", ("consume",), env, port, tmp_path / "consume.log"
    )
    first, second = uuid.uuid4(), uuid.uuid4()

    def applied(agent: uuid.UUID) -> bool:
        return bool(rows("agent_user_id = %(agent)s", {"agent": agent}))

    with consumer.start():
        consumer.wait_ready()
        for dependency in ("postgresql", "kafka"):  # exported at 0 from the start
            assert f'{COUNTER}{{dependency="{dependency}"}}' in consumer.metrics()
        publish(writer, settings.topic, event(first, uuid.uuid4(), 1, AgentMembershipStatus.ACTIVE))
        wait_until(lambda: applied(first), 60, "applied before the rotation", alive=[consumer])

        login.rotate(ROTATED)  # the file still holds the old password
        assert login.kill_sessions() >= 1
        publish(
            writer, settings.topic, event(second, uuid.uuid4(), 1, AgentMembershipStatus.ACTIVE)
        )
        wait_until(
            lambda: consumer.metric(COUNTER, dependency="postgresql") >= 1,
            60,
            "the refused login counted",
            alive=[consumer],
        )
        assert not applied(second)
        [line, *_] = logged(consumer.log_text(), "database authentication failed")
        assert line["level"] == "ERROR"
        assert line["user"] == login.name
        assert line["host"] == f"127.0.0.1:{conninfo_to_dict(login.base)['port']}"
        assert line["sqlstate"] == "28P01"
        assert consumer.metric(COUNTER, dependency="kafka") == 0

        secret.write_text(ROTATED + "\n")
        secret.chmod(0o640)
        wait_until(lambda: applied(second), 120, "applied after the rotation", alive=[consumer])
        wait_until(consumer.ready, 60, "ready again", alive=[consumer])
        assert consumer.terminate() == 0
    log = consumer.log_text()
    assert PASSWORD not in log
    assert ROTATED not in log
