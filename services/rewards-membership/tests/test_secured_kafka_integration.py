"""The consumer against a broker that requires SCRAM over TLS: right credentials work, wrong
ones stop the process at once with one line (and never the password)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from consumer_kit import publish

from pin_contracts import AgentMembershipStatus
from pin_runtime.kafka import create_admin, create_producer, ensure_topics
from pin_runtime.settings import load_settings
from pin_testkit.ports import free_port
from pin_testkit.private import PrivateKafka
from pin_testkit.secured import ScramLogin, SecuredKafka, assert_wrong_password_refused
from pin_testkit.service import ServiceProcess, service_environment
from pin_testkit.waiting import wait_until
from rewards_membership.settings import ENV_PREFIX, Settings


def _settings(secured: SecuredKafka, database: str, **overrides: str) -> Settings:
    topic, dlq = (f"pin-test.{uuid.uuid4().hex[:12]}" for _ in range(2))
    environ = {
        **secured.environment(ENV_PREFIX),
        f"{ENV_PREFIX}DATABASE_DSN": database,
        f"{ENV_PREFIX}TOPIC": topic,
        f"{ENV_PREFIX}DLQ_TOPIC": dlq,
        f"{ENV_PREFIX}GROUP_ID": f"secured-{uuid.uuid4().hex[:8]}",
        f"{ENV_PREFIX}POLL_TIMEOUT": "200ms",
        f"{ENV_PREFIX}LAG_INTERVAL": "200ms",
        **{f"{ENV_PREFIX}{k}": v for k, v in overrides.items()},
    }
    return load_settings(Settings, ENV_PREFIX, environ)


def test_consumer_applies_events_over_scram_and_tls(
    *,
    secured_kafka: SecuredKafka,
    consumer_dsn: str,
    event: Callable[..., Any],
    rows: Callable[..., list[dict[str, Any]]],
    wait: Callable[..., None],
    start_consumer: Callable[..., Any],
) -> None:
    settings = _settings(secured_kafka, consumer_dsn)
    security = settings.kafka_security()
    admin = create_admin(secured_kafka.bootstrap, client_id="secured-test", extra=security)
    ensure_topics(admin, [(settings.topic, 3), (settings.dlq_topic, 3)])
    agent, agency = uuid.uuid4(), uuid.uuid4()
    producer = create_producer(secured_kafka.bootstrap, client_id="secured-test", extra=security)
    publish(producer, settings.topic, event(agent, agency, 1, AgentMembershipStatus.ACTIVE))

    # The suite's consumer, every setting taken from the secured environment.
    consumer = start_consumer(**msgspec.structs.asdict(settings))
    wait(lambda: len(rows()) == 1, timeout=60, what="the event applied over SASL_SSL")
    consumer.close()
    [row] = rows()
    assert (row["agent_user_id"], row["company_id"], row["membership_status"]) == (
        agent,
        agency,
        "Active",
    )


def test_consume_with_a_wrong_password_stops_at_once_with_one_line(
    secured_kafka: SecuredKafka, consumer_dsn: str
) -> None:
    assert_wrong_password_refused(
        secured_kafka, "rewards-membership", ["consume"], ENV_PREFIX, DATABASE_DSN=consumer_dsn
    )


AUTH_FAILURES = "rewards_membership_auth_failures_total"
FIRST_PASSWORD = "first-Kafka-Secret-1"
ROTATED_PASSWORD = "second-Kafka-Secret-2"


@pytest.fixture(scope="module")
def restartable_secured_kafka() -> Iterator[PrivateKafka]:
    """A secured broker of this module's own, which a test may restart (the run's shared
    one serves every other test)."""
    with PrivateKafka.launch(secure=True) as broker:
        yield broker


def test_a_rotated_sasl_password_file_rebuilds_the_consumer_without_a_restart(
    *,
    restartable_secured_kafka: PrivateKafka,
    consumer_dsn: str,
    event: Callable[..., Any],
    rows: Callable[..., list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    broker = restartable_secured_kafka
    secured = broker.secured
    login = ScramLogin(secured, f"pin-rotate-{uuid.uuid4().hex[:10]}")
    login.set_password(FIRST_PASSWORD)
    secret = tmp_path / "kafka-password"
    secret.write_text(FIRST_PASSWORD + "\n")
    secret.chmod(0o640)  # a Secret volume's file under the pod's fsGroup
    topic, dlq = (f"pin-test.{uuid.uuid4().hex[:12]}" for _ in range(2))
    ensure_topics(
        create_admin(secured.plaintext_bootstrap, client_id="secured-test"),
        [(topic, 3), (dlq, 3)],
    )
    port = free_port()
    env = service_environment(
        (ENV_PREFIX,),
        **login.environment(ENV_PREFIX, secret),
        **{
            f"{ENV_PREFIX}DATABASE_DSN": consumer_dsn,
            f"{ENV_PREFIX}TOPIC": topic,
            f"{ENV_PREFIX}DLQ_TOPIC": dlq,
            f"{ENV_PREFIX}GROUP_ID": f"rotate-{uuid.uuid4().hex[:8]}",
            f"{ENV_PREFIX}POLL_TIMEOUT": "200ms",
            f"{ENV_PREFIX}METRICS_HOST": "127.0.0.1",
            f"{ENV_PREFIX}METRICS_PORT": str(port),
        },
    )
    writer = create_producer(secured.plaintext_bootstrap, client_id="secured-test")
    first, second = uuid.uuid4(), uuid.uuid4()
    consumer = ServiceProcess(
        "consume", "rewards-membership", ("consume",), env, port, tmp_path / "consume.log"
    )

    def applied(agent: uuid.UUID) -> bool:
        return bool(rows("agent_user_id = %(agent)s", {"agent": agent}))

    try:
        with consumer.start():
            consumer.wait_ready()
            publish(writer, topic, event(first, uuid.uuid4(), 1, AgentMembershipStatus.ACTIVE))
            wait_until(lambda: applied(first), 60, "applied as the user", alive=[consumer])

            # The password changes on the broker first; the Secret volume shows it later. A
            # connection authenticated before stays so: the broker's restart makes the
            # clients log in again, refused, which /readyz shows.
            login.set_password(ROTATED_PASSWORD)
            broker.stop()
            broker.start()
            publish(writer, topic, event(second, uuid.uuid4(), 1, AgentMembershipStatus.ACTIVE))
            wait_until(
                lambda: not consumer.ready(), 60, "not ready: login refused", alive=[consumer]
            )
            # Logged as such, counted and paged on (RewardsMembershipAuthFailed).
            wait_until(
                lambda: consumer.metric(AUTH_FAILURES, dependency="kafka") >= 1,
                30,
                "the refused login counted",
                alive=[consumer],
            )
            assert consumer.metric(AUTH_FAILURES, dependency="postgresql") == 0
            assert not applied(second)

            secret.write_text(ROTATED_PASSWORD + "\n")
            secret.chmod(0o640)
            wait_until(lambda: applied(second), 90, "applied after the rotation", alive=[consumer])
            wait_until(consumer.ready, 30, "ready again", alive=[consumer])
            assert consumer.terminate() == 0  # the one run there was, stopped here
    finally:
        login.delete()
    log = consumer.log_text()
    assert log.count("kafka clients rebuilt with the rotated SASL password") == 1
    refusals = [
        line
        for line in map(
            msgspec.json.decode, filter(lambda text: text.startswith("{"), log.splitlines())
        )
        if line.get("event") == "kafka authentication failed"
    ]
    assert refusals, "no 'kafka authentication failed' line"
    assert {(line["level"], line["user"]) for line in refusals} == {("ERROR", login.name)}
    assert FIRST_PASSWORD not in log
    assert ROTATED_PASSWORD not in log
