from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.errors import DeliveryError, KafkaSetupError, KafkaUnreachableError, SettingsError
from pin_runtime.kafka import (
    KafkaClientSettings,
    RepeatLimiter,
    admin_config,
    consumer_config,
    create_admin,
    create_consumer,
    create_producer,
    producer_config,
    report_refused_login,
    security_config,
    verify_connection,
)
from pin_runtime.kafka_security import kafka_or_exit
from pin_runtime.logging import FIELDS_ATTRIBUTE
from pin_runtime.settings import load_settings, settings_or_exit
from pin_testkit.ports import free_port

UnreachableProducer = Callable[..., Producer]  # the conftest fixture


def test_producer_config() -> None:
    assert producer_config("k1:9092,k2:9092", client_id="identity-outbox-relay") == {
        "bootstrap.servers": "k1:9092,k2:9092",
        "client.id": "identity-outbox-relay",
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": 10,
        "compression.type": "lz4",
        # Partitions added to a topic are seen within 10 s (librdkafka's default: 300 s).
        "topic.metadata.refresh.interval.ms": 10_000,
    }


def test_producer_overrides() -> None:
    config = producer_config(
        "k:9092",
        client_id="c",
        linger_ms=50,
        compression="zstd",
        extra={"message.timeout.ms": 60000, "max.in.flight.requests.per.connection": 1},
    )
    assert config["linger.ms"] == 50
    assert config["compression.type"] == "zstd"
    assert config["message.timeout.ms"] == 60000
    assert config["max.in.flight.requests.per.connection"] == 1


def test_producer_rejects_too_many_in_flight_with_idempotence() -> None:
    with pytest.raises(ValueError, match="<= 5"):
        producer_config("k:9092", client_id="c", extra={"max.in.flight.requests.per.connection": 6})


def test_consumer_config() -> None:
    assert consumer_config(
        "k:9092", group_id="pin-rewards-identity-membership", client_id="rewards-1"
    ) == {
        "bootstrap.servers": "k:9092",
        "client.id": "rewards-1",
        "group.id": "pin-rewards-identity-membership",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "isolation.level": "read_committed",
        "topic.metadata.refresh.interval.ms": 10_000,
    }


def test_consumer_extra_overrides() -> None:
    config = consumer_config("k:9092", group_id="g", client_id="c", extra={"fetch.min.bytes": 1})
    assert config["fetch.min.bytes"] == 1


@pytest.mark.parametrize(
    ("bootstrap", "group_id", "client_id"), [("", "g", "c"), ("k", " ", "c"), ("k", "g", "")]
)
def test_empty_identifiers_rejected(bootstrap: str, group_id: str, client_id: str) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        consumer_config(bootstrap, group_id=group_id, client_id=client_id)


def test_admin_config() -> None:
    assert admin_config("k:9092", client_id="a", extra={"socket.timeout.ms": 1000}) == {
        "bootstrap.servers": "k:9092",
        "client.id": "a",
        "socket.timeout.ms": 1000,
    }


def test_clients_construct_without_a_broker() -> None:
    # librdkafka validates the whole config at construction; no connection is needed.
    producer = create_producer("127.0.0.1:1", client_id="p")
    consumer = create_consumer("127.0.0.1:1", group_id="g", client_id="c")
    admin = create_admin("127.0.0.1:1", client_id="a")
    assert isinstance(producer, Producer)
    assert isinstance(consumer, Consumer)
    assert isinstance(admin, AdminClient)
    consumer.close()


def test_error_callback_logs_and_forwards(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[KafkaError] = []
    # A client id of its own: a repeated error of one client is logged once per interval in
    # the whole process (pin_runtime.kafka.ERROR_LOG_INTERVAL), whichever test saw it first.
    producer = create_producer(
        "127.0.0.1:1",
        client_id=f"p-{uuid.uuid4().hex[:8]}",
        extra={"socket.connection.setup.timeout.ms": 1000},
        on_error=seen.append,
    )
    with caplog.at_level(logging.WARNING, logger="pin_runtime.kafka"):
        # An unreachable broker surfaces as _TRANSPORT / _ALL_BROKERS_DOWN through poll().
        for _ in range(50):
            producer.poll(0.1)
            if seen:
                break
    assert seen
    assert any(r.getMessage() == "kafka client error" for r in caplog.records)


def test_delivery_tracker() -> None:
    tracker = DeliveryTracker[int]()
    tracker.raise_for_failures()  # nothing failed yet
    assert tracker.delivered == 0


def test_flush_or_raise_reports_queued_messages(unreachable_producer: UnreachableProducer) -> None:
    producer = unreachable_producer({"message.timeout.ms": 60000})
    tracker = DeliveryTracker[int]()
    producer.produce("t", b"v", on_delivery=tracker)
    with pytest.raises(DeliveryError, match="still queued"):
        flush_or_raise(producer, 0.2, tracker)


def test_flush_or_raise_reports_failed_deliveries(
    unreachable_producer: UnreachableProducer,
) -> None:
    # message.timeout.ms expires while the broker is unreachable: a delivery error.
    producer = unreachable_producer({"message.timeout.ms": 200})
    tracker = DeliveryTracker[int]()
    producer.produce("t", b"v", on_delivery=tracker)
    with pytest.raises(DeliveryError, match="not delivered"):
        flush_or_raise(producer, 10.0, tracker)
    assert tracker.all_failures()[0].code == "_MSG_TIMED_OUT"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, {"security.protocol": "PLAINTEXT"}),
        (
            {
                "protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "u",
                "sasl_password": "p",
                "ssl_ca_location": "/etc/ca.pem",
            },
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "u",
                "sasl.password": "p",
                "ssl.ca.location": "/etc/ca.pem",
            },
        ),
        (
            {
                "protocol": "SSL",
                "ssl_ca_location": "/ca.pem",
                "ssl_certificate_location": "/client.pem",
                "ssl_key_location": "/client.key",
                "ssl_key_password": "kp",
            },
            {
                "security.protocol": "SSL",
                "ssl.ca.location": "/ca.pem",
                "ssl.certificate.location": "/client.pem",
                "ssl.key.location": "/client.key",
                "ssl.key.password": "kp",
            },
        ),
    ],
    ids=["plaintext-by-default", "sasl-ssl", "client-certificate"],
)
def test_security_config_is_librdkafkas_keys(
    settings: dict[str, str], expected: dict[str, str]
) -> None:
    assert security_config(**settings) == expected  # type: ignore[arg-type]


def test_security_config_sasl_needs_credentials() -> None:
    with pytest.raises(ValueError, match="SASL"):
        security_config(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512")


def test_kafka_client_settings_are_read_with_the_service_prefix() -> None:
    class ServiceSettings(KafkaClientSettings, frozen=True, kw_only=True):
        batch_size: int = 10

    settings = load_settings(
        ServiceSettings,
        "SVC_",
        {
            "SVC_KAFKA_BOOTSTRAP": "k1:9092",
            "SVC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "SVC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
            "SVC_KAFKA_SASL_USERNAME": "svc",
            "SVC_KAFKA_SASL_PASSWORD": "secret",
        },
    )
    assert settings.kafka_bootstrap == "k1:9092"
    assert settings.kafka_security()["sasl.password"] == "secret"
    assert "secret" not in repr(settings)
    with pytest.raises(SettingsError, match="SVC_KAFKA_SECURITY_PROTOCOL"):
        load_settings(ServiceSettings, "SVC_", {"SVC_KAFKA_SECURITY_PROTOCOL": "TLS"})


def test_security_config_refuses_sasl_plain_in_clear_text_unless_allowed() -> None:
    plain = {
        "protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "u",
        "sasl_password": "p",
    }
    with pytest.raises(ValueError, match="clear text"):
        security_config(**plain)  # type: ignore[arg-type]
    assert security_config(**plain, allow_plaintext_sasl_plain=True)["sasl.mechanism"] == "PLAIN"  # type: ignore[arg-type]
    # SCRAM never sends the password, and PLAIN inside TLS is encrypted: both accepted.
    assert security_config(**{**plain, "sasl_mechanism": "SCRAM-SHA-512"})  # type: ignore[arg-type]
    assert security_config(**{**plain, "protocol": "SASL_SSL"})  # type: ignore[arg-type]


def test_security_config_client_certificate_needs_its_key_and_tls() -> None:
    with pytest.raises(ValueError, match="both"):
        security_config(protocol="SSL", ssl_certificate_location="/client.pem")
    with pytest.raises(ValueError, match="SSL or SASL_SSL"):
        security_config(ssl_certificate_location="/c.pem", ssl_key_location="/c.key")


SASL = {
    "SVC_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "SVC_KAFKA_SASL_MECHANISM": "PLAIN",
    "SVC_KAFKA_SASL_USERNAME": "svc",
    "SVC_KAFKA_SASL_PASSWORD": "secret",
}


class _Svc(KafkaClientSettings, frozen=True, kw_only=True):
    pass


@pytest.mark.parametrize(
    ("environ", "variable", "reason"),
    [
        (SASL, "SVC_KAFKA_SECURITY_PROTOCOL", "clear text"),
        (
            {**SASL, "SVC_KAFKA_ALLOW_PLAINTEXT_SASL_PLAIN": "false"},
            "SVC_KAFKA_SECURITY_PROTOCOL",
            "KAFKA_ALLOW_PLAINTEXT_SASL_PLAIN=true",
        ),
        (
            {**SASL, "SVC_KAFKA_SASL_PASSWORD": ""},
            "SVC_KAFKA_SASL_PASSWORD",
            "required with SASL_PLAINTEXT",
        ),
        (
            {"SVC_KAFKA_SECURITY_PROTOCOL": "SSL", "SVC_KAFKA_SSL_CERTIFICATE_LOCATION": "/c"},
            "SVC_KAFKA_SSL_KEY_LOCATION",
            "required with SVC_KAFKA_SSL_CERTIFICATE_LOCATION",
        ),
        (
            {"SVC_KAFKA_SSL_CERTIFICATE_LOCATION": "/c", "SVC_KAFKA_SSL_KEY_LOCATION": "/k"},
            "SVC_KAFKA_SSL_CERTIFICATE_LOCATION",
            "SSL or SASL_SSL, not PLAINTEXT",
        ),
        (
            {"SVC_KAFKA_SECURITY_PROTOCOL": "SSL", "SVC_KAFKA_SSL_KEY_PASSWORD": "kp"},
            "SVC_KAFKA_SSL_KEY_PASSWORD",
            "without SVC_KAFKA_SSL_KEY_LOCATION",
        ),
    ],
)
def test_unsafe_or_half_configured_security_names_the_variable(
    environ: dict[str, str], variable: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(_Svc, "SVC_", environ)
    assert caught.value.variable == variable
    assert reason in caught.value.reason
    with pytest.raises(SystemExit) as exited:
        settings_or_exit(_Svc, "SVC_", environ)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: {variable}: ")
    assert "secret" not in err


def test_sasl_plain_in_clear_text_when_explicitly_allowed() -> None:
    settings = load_settings(_Svc, "SVC_", {**SASL, "SVC_KAFKA_ALLOW_PLAINTEXT_SASL_PLAIN": "true"})
    assert settings.kafka_security()["sasl.mechanism"] == "PLAIN"


def test_client_certificate_settings_reach_librdkafka(tmp_path: Path) -> None:
    # Files librdkafka will read (checked at start: a missing one is the variable's error).
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("-----BEGIN-----\n")
    settings = load_settings(
        _Svc,
        "SVC_",
        {
            "SVC_KAFKA_BOOTSTRAP": "k:9093",
            "SVC_KAFKA_SECURITY_PROTOCOL": "SSL",
            "SVC_KAFKA_SSL_CA_LOCATION": str(tmp_path / "ca.pem"),
            "SVC_KAFKA_SSL_CERTIFICATE_LOCATION": str(tmp_path / "client.pem"),
            "SVC_KAFKA_SSL_KEY_LOCATION": str(tmp_path / "client.key"),
            "SVC_KAFKA_SSL_KEY_PASSWORD": "key-secret",
        },
    )
    assert "key-secret" not in repr(settings)
    assert settings.kafka_connection() == {
        "bootstrap.servers": "k:9093",
        "security.protocol": "SSL",
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"),
        "ssl.key.password": "key-secret",
    }


def test_verify_connection_reports_unreachable_brokers_within_its_timeout() -> None:
    port = free_port()  # nothing listens on it
    started = time.monotonic()
    with pytest.raises(
        KafkaUnreachableError, match=rf"^Kafka brokers unreachable at 127.0.0.1:{port}"
    ):
        verify_connection({"bootstrap.servers": f"127.0.0.1:{port}"}, timeout=2)
    assert time.monotonic() - started < 6


def test_verify_connection_reports_refused_client_settings(tmp_path: Path) -> None:
    missing = tmp_path / "nope.key"
    with pytest.raises(KafkaSetupError, match=r"^Kafka client settings refused: ") as caught:
        verify_connection(
            {
                "bootstrap.servers": "127.0.0.1:9",
                "security.protocol": "SSL",
                "ssl.certificate.location": str(tmp_path / "nope.pem"),
                "ssl.key.location": str(missing),
                "ssl.key.password": "key-secret",
            },
            timeout=2,
        )
    assert "key-secret" not in str(caught.value)


def test_a_tls_file_that_is_not_there_is_the_variables_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # librdkafka refused the whole client when it was made, after the process started.
    settings = load_settings(
        _Svc,
        "SVC_",
        {
            "SVC_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "SVC_KAFKA_SECURITY_PROTOCOL": "SSL",
            "SVC_KAFKA_SSL_CA_LOCATION": str(tmp_path),
        },
    )
    assert settings.unreadable_tls_file() == "kafka_ssl_ca_location"
    with pytest.raises(SystemExit) as exited:
        kafka_or_exit(settings, "SVC_", command="relay")
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"config error: SVC_KAFKA_SSL_CA_LOCATION: no readable file at {str(tmp_path)!r}\n"
    )


@pytest.mark.parametrize(
    ("code", "told"),
    [
        (KafkaError.SASL_AUTHENTICATION_FAILED, True),
        (KafkaError._AUTHENTICATION, True),
        (KafkaError._TRANSPORT, False),
        (KafkaError._ALL_BROKERS_DOWN, False),
    ],
)
def test_a_refused_login_is_logged_and_counted_and_nothing_else_is(
    code: int, told: bool, caplog: pytest.LogCaptureFixture
) -> None:
    counted: list[None] = []
    config = {
        "sasl.username": "pin-consumer",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": "a-Secret-1",
    }
    with caplog.at_level(logging.INFO):
        assert (
            report_refused_login(KafkaError(code, "refused"), config, lambda: counted.append(None))
            is told
        )
    assert len(counted) == int(told)
    refusals = [r for r in caplog.records if r.getMessage() == "kafka authentication failed"]
    assert len(refusals) == int(told)
    if told:
        [record] = refusals
        assert record.levelno == logging.ERROR
        fields = getattr(record, FIELDS_ATTRIBUTE)
        assert fields["user"] == "pin-consumer"
        assert fields["mechanism"] == "SCRAM-SHA-512"
    assert "a-Secret-1" not in caplog.text


def test_a_repeated_line_is_logged_once_per_interval_with_what_was_left_out() -> None:
    now = [0.0]
    limiter = RepeatLimiter(30.0, clock=lambda: now[0])
    key = ("relay", "_TRANSPORT")
    assert limiter.admit(key) == 0
    for second in range(1, 30):
        now[0] = float(second)
        assert limiter.admit(key) is None
    assert limiter.admit(("relay", "_ALL_BROKERS_DOWN")) == 0  # another error: its own line
    assert limiter.admit(("worker", "_TRANSPORT")) == 0  # another client: its own line
    now[0] = 30.0
    assert limiter.admit(key) == 29
    now[0] = 31.0
    assert limiter.admit(key) is None


def test_an_unreachable_broker_gives_one_line_per_error_not_one_per_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[KafkaError] = []
    producer = create_producer(
        "127.0.0.1:1",
        client_id=f"repeats-{uuid.uuid4().hex[:8]}",
        extra={"reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 10},
        on_error=seen.append,
    )
    with caplog.at_level(logging.DEBUG, logger="pin_runtime.kafka"):
        deadline = time.monotonic() + 30
        # librdkafka reconnects every 10 ms: many errors, each forwarded to on_error.
        while len(seen) < 5 and time.monotonic() < deadline:
            producer.poll(0.1)
    assert len(seen) >= 5
    lines = [r for r in caplog.records if r.getMessage() == "kafka client error"]
    codes = [getattr(r, FIELDS_ATTRIBUTE)["code"] for r in lines]
    assert len(codes) == len(set(codes)), codes
    # librdkafka's own line of each connection failure is error_cb's line: left out.
    assert not [
        r for r in caplog.records if r.name.endswith("librdkafka") and "FAIL" in str(r.args)
    ]
