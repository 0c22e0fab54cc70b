"""``secured_kafka``: a broker that requires TLS and SCRAM, or a client certificate, for real."""

from __future__ import annotations

import socket
import ssl
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from pin_runtime.kafka import create_admin, ensure_topics
from pin_testkit.records import first_value
from pin_testkit.secured import SecuredKafka

pytestmark = pytest.mark.integration


def _topic(secured: SecuredKafka) -> str:
    """A new topic, created over the broker's own PLAINTEXT listener (test set-up only)."""
    name = f"pin-test.{uuid.uuid4().hex[:12]}"
    ensure_topics(create_admin(secured.plaintext_bootstrap, client_id="setup"), [(name, 1)])
    return name


def _round_trip(config: dict[str, str | int | float | bool], topic: str) -> bytes:
    """Produce one record with ``config`` and read it back with the same identity."""
    value = uuid.uuid4().bytes
    producer = Producer({**config, "linger.ms": 0, "message.timeout.ms": 20000})
    reports: list[KafkaError | None] = []
    producer.produce(topic, value=value, on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(30) == 0
    assert reports == [None]
    consumer = Consumer(
        {**config, "group.id": f"g-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"}
    )
    return first_value(consumer, topic)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_scram_over_tls_produces_and_consumes(secured_kafka: SecuredKafka, mechanism: str) -> None:
    topic = _topic(secured_kafka)
    config = secured_kafka.sasl_config(**{"sasl.mechanism": mechanism})
    assert _round_trip(config, topic)


def test_client_certificate_listener_serves_a_signed_client(secured_kafka: SecuredKafka) -> None:
    topic = _topic(secured_kafka)
    assert _round_trip(secured_kafka.mtls_config(), topic)


def _talk_without_certificate(address: str, ca_file: str) -> None:
    host, port = address.split(":")
    context = ssl.create_default_context(cafile=ca_file)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        # TLS 1.3: the server's refusal of the missing certificate arrives with the first read.
        tls.sendall(b"\x00")
        if not tls.recv(1):
            raise ConnectionError("closed by the broker")


def test_client_certificate_listener_refuses_a_client_without_one(
    secured_kafka: SecuredKafka,
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _talk_without_certificate(secured_kafka.mtls_bootstrap, str(secured_kafka.tls.ca_file))


def test_wrong_password_is_refused(secured_kafka: SecuredKafka) -> None:
    errors: list[KafkaError] = []
    admin = AdminClient(
        secured_kafka.sasl_config(**{"sasl.password": "wrong", "error_cb": errors.append})  # type: ignore[arg-type]
    )
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        admin.poll(0.5)
    assert errors, "no error reported for a wrong password"
    assert errors[0].code() == KafkaError._AUTHENTICATION
