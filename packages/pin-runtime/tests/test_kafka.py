from __future__ import annotations

import logging

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from pin_runtime.delivery import DeliveryTracker, flush_or_raise
from pin_runtime.errors import DeliveryError, SettingsError
from pin_runtime.kafka import (
    KafkaClientSettings,
    admin_config,
    consumer_config,
    create_admin,
    create_consumer,
    create_producer,
    producer_config,
    security_config,
)
from pin_runtime.settings import load_settings


def test_producer_config() -> None:
    assert producer_config("k1:9092,k2:9092", client_id="identity-outbox-relay") == {
        "bootstrap.servers": "k1:9092,k2:9092",
        "client.id": "identity-outbox-relay",
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": 10,
        "compression.type": "lz4",
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
    producer = create_producer(
        "127.0.0.1:1",
        client_id="p",
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


def test_flush_or_raise_reports_queued_messages() -> None:
    producer = create_producer("127.0.0.1:1", client_id="p", extra={"message.timeout.ms": 60000})
    tracker = DeliveryTracker[int]()
    producer.produce("t", b"v", on_delivery=tracker)
    with pytest.raises(DeliveryError, match="still queued"):
        flush_or_raise(producer, 0.2, tracker)


def test_flush_or_raise_reports_failed_deliveries() -> None:
    # message.timeout.ms expires while the broker is unreachable: a delivery error.
    producer = create_producer("127.0.0.1:1", client_id="p", extra={"message.timeout.ms": 200})
    tracker = DeliveryTracker[int]()
    producer.produce("t", b"v", on_delivery=tracker)
    with pytest.raises(DeliveryError, match="not delivered"):
        flush_or_raise(producer, 10.0, tracker)
    assert tracker.all_failures()[0].code == "_MSG_TIMED_OUT"


def test_security_config_plaintext_by_default() -> None:
    assert security_config() == {"security.protocol": "PLAINTEXT"}


def test_security_config_sasl_needs_credentials() -> None:
    with pytest.raises(ValueError, match="SASL"):
        security_config(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512")
    assert security_config(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="p",
        ssl_ca_location="/etc/ca.pem",
    ) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": "/etc/ca.pem",
    }


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
