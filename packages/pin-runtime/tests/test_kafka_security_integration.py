"""Clients of a broker that requires TLS and SCRAM, or a client certificate (``secured_kafka``).

The settings are read as a service reads them (``<PREFIX>KAFKA_*``), so what works here is
what a service configured the same way does.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from pin_runtime.errors import KafkaSetupError, KafkaUnreachableError
from pin_runtime.kafka import (
    KafkaClientSettings,
    create_admin,
    create_consumer,
    create_producer,
    ensure_topics,
    verify_connection,
)
from pin_runtime.settings import load_settings
from pin_testkit.local.tls import CertificateAuthority
from pin_testkit.records import first_value
from pin_testkit.secured import SecuredKafka

pytestmark = pytest.mark.integration

PREFIX = "SVC_"
FAIL_FAST = 5.0  # seconds within which a refused login or handshake must be reported


class Svc(KafkaClientSettings, frozen=True, kw_only=True):
    pass


def settings(secured: SecuredKafka, **overrides: str) -> Svc:
    environ = secured.environment(PREFIX) | {PREFIX + k: v for k, v in overrides.items()}
    return load_settings(Svc, PREFIX, environ)


def new_topic(secured: SecuredKafka) -> str:
    name = f"pin-runtime-secured-{uuid.uuid4().hex[:12]}"
    ensure_topics(create_admin(secured.plaintext_bootstrap, client_id="setup"), [(name, 1)])
    return name


def round_trip(svc: Svc, topic: str) -> bytes:
    """Produce one record and consume it with the clients the services use."""
    value = uuid.uuid4().bytes
    producer = create_producer(
        svc.kafka_bootstrap, client_id="secured-producer", extra=svc.kafka_security()
    )
    producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    consumer = create_consumer(
        svc.kafka_bootstrap,
        group_id=f"secured-{uuid.uuid4().hex}",
        client_id="secured-consumer",
        extra=svc.kafka_security(),
    )
    return first_value(consumer, topic)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_right_scram_credentials_over_tls_produce_and_consume(
    secured_kafka: SecuredKafka, mechanism: str
) -> None:
    svc = settings(secured_kafka, KAFKA_SASL_MECHANISM=mechanism)
    verify_connection(svc.kafka_connection(), timeout=20)
    topic = new_topic(secured_kafka)
    assert len(round_trip(svc, topic)) == 16


def test_wrong_password_fails_fast_naming_the_user(secured_kafka: SecuredKafka) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    svc = settings(secured_kafka, KAFKA_SASL_PASSWORD=wrong)
    started = time.monotonic()
    with pytest.raises(KafkaSetupError) as caught:
        verify_connection(svc.kafka_connection(), timeout=30)
    took = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith(
        f"Kafka authentication failed for user '{secured_kafka.username}' (SCRAM-SHA-512) "
        f"at {secured_kafka.bootstrap}: "
    ), message
    assert "\n" not in message
    assert wrong not in message
    assert secured_kafka.password not in message
    # A refused login is not an outage to wait out: the services stop on it.
    assert not isinstance(caught.value, KafkaUnreachableError)
    assert took < FAIL_FAST, f"took {took:.1f}s"


def test_unknown_user_fails_fast(secured_kafka: SecuredKafka) -> None:
    svc = settings(secured_kafka, KAFKA_SASL_USERNAME="nobody")
    with pytest.raises(KafkaSetupError, match=r"^Kafka authentication failed for user 'nobody'"):
        verify_connection(svc.kafka_connection(), timeout=30)


def test_wrong_ca_is_a_tls_handshake_failure(secured_kafka: SecuredKafka, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(CertificateAuthority("another CA").own.certificate_pem())
    svc = settings(secured_kafka, KAFKA_SSL_CA_LOCATION=str(other_ca))
    started = time.monotonic()
    with pytest.raises(KafkaSetupError) as caught:
        verify_connection(svc.kafka_connection(), timeout=30)
    message = str(caught.value)
    assert message.startswith(f"TLS handshake with Kafka at {secured_kafka.bootstrap} failed: ")
    assert "certificate verify failed" in message
    assert secured_kafka.password not in message
    assert time.monotonic() - started < FAIL_FAST


def test_client_certificate_authenticates_on_the_mutual_tls_listener(
    secured_kafka: SecuredKafka,
) -> None:
    svc = load_settings(
        Svc,
        PREFIX,
        {
            "SVC_KAFKA_BOOTSTRAP": secured_kafka.mtls_bootstrap,
            "SVC_KAFKA_SECURITY_PROTOCOL": "SSL",
            "SVC_KAFKA_SSL_CA_LOCATION": str(secured_kafka.tls.ca_file),
            "SVC_KAFKA_SSL_CERTIFICATE_LOCATION": str(secured_kafka.tls.client_certificate),
            "SVC_KAFKA_SSL_KEY_LOCATION": str(secured_kafka.tls.client_key),
            "SVC_KAFKA_SSL_KEY_PASSWORD": secured_kafka.tls.client_key_password,
        },
    )
    verify_connection(svc.kafka_connection(), timeout=20)
    assert len(round_trip(svc, new_topic(secured_kafka))) == 16


def test_mutual_tls_listener_refuses_a_client_without_a_certificate(
    secured_kafka: SecuredKafka,
) -> None:
    config = {
        "bootstrap.servers": secured_kafka.mtls_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(secured_kafka.tls.ca_file),
    }
    with pytest.raises(KafkaSetupError, match=r"^TLS handshake with Kafka at "):
        verify_connection(config, timeout=30)


def test_wrong_key_password_is_refused_before_connecting(secured_kafka: SecuredKafka) -> None:
    config = secured_kafka.mtls_config(**{"ssl.key.password": "not-the-key-password"})
    with pytest.raises(KafkaSetupError, match=r"^Kafka client settings refused: ") as caught:
        verify_connection(config, timeout=10)
    assert "not-the-key-password" not in str(caught.value)
