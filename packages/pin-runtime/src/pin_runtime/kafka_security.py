"""How a Kafka client authenticates: settings, their librdkafka form, and a fail-fast check.

`KafkaClientSettings` refuses what would leak a password (SASL PLAIN over a connection without
TLS) unless explicitly allowed, and half-configured TLS client certificates.
`verify_connection` turns "the client can never authenticate" from an endless retry loop in
librdkafka's background threads into one clear error at start-up.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Final, Literal, NoReturn

import msgspec
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pin_runtime.errors import KafkaSetupError, KafkaUnreachableError
from pin_runtime.logging import log_event
from pin_runtime.settings import CONFIG_ERROR_EXIT_CODE, Secret

__all__ = [
    "ConfigValue",
    "KafkaClientSettings",
    "KafkaConfig",
    "SaslMechanism",
    "SecurityProtocol",
    "kafka_or_exit",
    "security_config",
    "verify_connection",
]

ConfigValue = str | int | float | bool
KafkaConfig = dict[str, ConfigValue]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_TLS_PROTOCOLS: Final = frozenset({"SSL", "SASL_SSL"})
_SECRET_KEYS: Final = ("sasl.password", "ssl.key.password")
# How librdkafka words TLS failures it reports as transport errors: a handshake it refused,
# or (TLS 1.3) the broker's alert after the handshake, e.g. for a missing client certificate.
_TLS_MARKS: Final = ("SSL handshake failed", "ssl/tls alert", "SSL routines")
_PROBE_SLICE: Final = 0.5  # seconds per metadata attempt, so error callbacks are seen promptly
_log = logging.getLogger("pin_runtime.kafka")
_verify_log = logging.getLogger("pin_runtime.kafka.librdkafka")


def security_config(
    *,
    protocol: SecurityProtocol = "PLAINTEXT",
    sasl_mechanism: SaslMechanism | None = None,
    sasl_username: str | None = None,
    sasl_password: str | None = None,
    ssl_ca_location: str | None = None,
    ssl_certificate_location: str | None = None,
    ssl_key_location: str | None = None,
    ssl_key_password: str | None = None,
    allow_plaintext_sasl_plain: bool = False,
) -> KafkaConfig:
    """librdkafka settings for how a client authenticates, from the services' settings.

    Raises `ValueError` for SASL without credentials, SASL PLAIN without TLS (the password
    would cross the network in clear text) unless `allow_plaintext_sasl_plain`, and a client
    certificate without its key (or the reverse).
    """
    config: KafkaConfig = {"security.protocol": protocol}
    if protocol.startswith("SASL"):
        if not (sasl_mechanism and sasl_username and sasl_password):
            raise ValueError(f"{protocol} needs a SASL mechanism, username and password")
        if (
            protocol == "SASL_PLAINTEXT"
            and sasl_mechanism == "PLAIN"
            and not allow_plaintext_sasl_plain
        ):
            raise ValueError(_PLAIN_IN_CLEAR)
        config |= {
            "sasl.mechanism": sasl_mechanism,
            "sasl.username": sasl_username,
            "sasl.password": sasl_password,
        }
    if ssl_ca_location:
        config["ssl.ca.location"] = ssl_ca_location
    if bool(ssl_certificate_location) != bool(ssl_key_location):
        raise ValueError("a client certificate needs both its certificate and its key")
    if ssl_certificate_location and ssl_key_location:
        if protocol not in _TLS_PROTOCOLS:
            raise ValueError(f"a client certificate needs SSL or SASL_SSL, not {protocol}")
        config["ssl.certificate.location"] = ssl_certificate_location
        config["ssl.key.location"] = ssl_key_location
        if ssl_key_password:
            config["ssl.key.password"] = ssl_key_password
    return config


_PLAIN_IN_CLEAR: Final = (
    "SASL_PLAINTEXT with mechanism PLAIN sends the password in clear text; use SASL_SSL or a "
    "SCRAM mechanism, or set KAFKA_ALLOW_PLAINTEXT_SASL_PLAIN=true to accept that"
)


class KafkaClientSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The Kafka connection settings every service reads, as fields of its own Settings.

    A service's `Settings` inherits them, so `<PREFIX>KAFKA_BOOTSTRAP` and friends mean
    the same thing in every service.
    """

    kafka_bootstrap: str = ""
    """Bootstrap servers; required by the commands that talk to Kafka."""
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: SaslMechanism | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: Secret | None = None
    kafka_ssl_ca_location: str | None = None
    """PEM file of the CA that signs the brokers' certificates; unset: the system CAs."""
    kafka_ssl_certificate_location: str | None = None
    """PEM client certificate for mutual TLS (with `kafka_ssl_key_location`)."""
    kafka_ssl_key_location: str | None = None
    """PEM private key of the client certificate."""
    kafka_ssl_key_password: Secret | None = None
    """Password of an encrypted client key."""
    kafka_allow_plaintext_sasl_plain: bool = False
    """SASL PLAIN over SASL_PLAINTEXT puts the password on the wire; refused unless true."""

    def __post_init__(self) -> None:
        # Named by field (upper-cased, no prefix): `load_settings` adds the service's prefix.
        protocol = self.kafka_security_protocol
        if protocol.startswith("SASL"):
            for name in ("kafka_sasl_mechanism", "kafka_sasl_username", "kafka_sasl_password"):
                if not getattr(self, name):
                    raise ValueError(f"{name.upper()}: required with {protocol}")
        if (
            protocol == "SASL_PLAINTEXT"
            and self.kafka_sasl_mechanism == "PLAIN"
            and not self.kafka_allow_plaintext_sasl_plain
        ):
            raise ValueError(f"KAFKA_SECURITY_PROTOCOL: {_PLAIN_IN_CLEAR}")
        certificate, key = self.kafka_ssl_certificate_location, self.kafka_ssl_key_location
        if certificate and not key:
            raise ValueError("KAFKA_SSL_KEY_LOCATION: required with KAFKA_SSL_CERTIFICATE_LOCATION")
        if key and not certificate:
            raise ValueError("KAFKA_SSL_CERTIFICATE_LOCATION: required with KAFKA_SSL_KEY_LOCATION")
        if certificate and protocol not in _TLS_PROTOCOLS:
            raise ValueError(
                f"KAFKA_SSL_CERTIFICATE_LOCATION: a client certificate needs "
                f"KAFKA_SECURITY_PROTOCOL SSL or SASL_SSL, not {protocol}"
            )
        if self.kafka_ssl_key_password is not None and not key:
            raise ValueError("KAFKA_SSL_KEY_PASSWORD: set without KAFKA_SSL_KEY_LOCATION")

    def kafka_security(self) -> KafkaConfig:
        """The librdkafka settings of this authentication, for every client's `extra`."""
        return security_config(
            protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=self.kafka_sasl_password.reveal() if self.kafka_sasl_password else None,
            ssl_ca_location=self.kafka_ssl_ca_location,
            ssl_certificate_location=self.kafka_ssl_certificate_location,
            ssl_key_location=self.kafka_ssl_key_location,
            ssl_key_password=(
                self.kafka_ssl_key_password.reveal() if self.kafka_ssl_key_password else None
            ),
            allow_plaintext_sasl_plain=self.kafka_allow_plaintext_sasl_plain,
        )

    def kafka_connection(self) -> KafkaConfig:
        """Bootstrap servers and authentication: what `verify_connection` needs."""
        return {"bootstrap.servers": self.kafka_bootstrap, **self.kafka_security()}


# -- fail fast ----------------------------------------------------------------------------------


def verify_connection(config: Mapping[str, ConfigValue], *, timeout: float = 10.0) -> None:
    """Connect with `config` (bootstrap servers and security settings) and read metadata.

    Returns once a broker answered. Raises `KafkaSetupError` with one line that names the
    problem: the credentials were refused (`Kafka authentication failed for user 'x' ...`),
    the TLS handshake failed (wrong CA, client certificate refused), the client settings were
    refused by librdkafka (an unreadable key file), or no broker answered within `timeout`
    seconds. A refused login or handshake is reported as soon as librdkafka reports it, not
    after `timeout`. Secrets of `config` never appear in the message.
    """
    errors: list[KafkaError] = []
    client_config: dict[str, Any] = {
        **config,
        "error_cb": errors.append,
        "logger": _verify_log,
        # The outcome is the exception; librdkafka's own lines would repeat it per retry.
        "log_level": 0,
    }
    secrets = [str(config[key]) for key in _SECRET_KEYS if config.get(key)]
    try:
        admin = AdminClient(client_config)
    except KafkaException as exc:
        reason = _scrub(_reason(exc), secrets)
        raise KafkaSetupError(f"Kafka client settings refused: {reason}") from None
    try:
        problem = _probe(admin, errors, config, timeout)
    finally:
        # The client retries in background threads until it is destroyed: do not keep it
        # alive in the traceback of the error raised below.
        del admin
    if problem is not None:
        unreachable, message = problem
        error = KafkaUnreachableError if unreachable else KafkaSetupError
        raise error(_scrub(message, secrets))


def _probe(
    admin: AdminClient,
    errors: list[KafkaError],
    config: Mapping[str, ConfigValue],
    timeout: float,
) -> tuple[bool, str] | None:
    """None once a broker answered; else (unreachable, the one-line problem)."""
    bootstrap = str(config.get("bootstrap.servers", ""))
    deadline = time.monotonic() + timeout
    last: KafkaError | None = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            metadata = admin.list_topics(timeout=max(0.1, min(_PROBE_SLICE, remaining)))
        except KafkaException as exc:
            last = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else last
        else:
            if metadata.brokers:
                return None
        admin.poll(0)  # serves error_cb
        verdict = _verdict(errors, config, bootstrap)
        if verdict is not None:
            return False, verdict
        if remaining <= 0:
            seen = errors[-1] if errors else last
            detail = f": {seen.str()}" if seen is not None else ""
            return True, f"Kafka brokers unreachable at {bootstrap} within {timeout:g}s{detail}"


def _verdict(
    errors: list[KafkaError], config: Mapping[str, ConfigValue], bootstrap: str
) -> str | None:
    """The message of an error that retrying will not cure, or None."""
    for error in errors:
        text = error.str()
        if error.code() == KafkaError._AUTHENTICATION or "SASL authentication error" in text:
            if "SSL" in text and "handshake" in text:
                return f"TLS handshake with Kafka at {bootstrap} failed: {text}"
            user = config.get("sasl.username", "")
            mechanism = config.get("sasl.mechanism", "")
            return (
                f"Kafka authentication failed for user {user!r} ({mechanism}) "
                f"at {bootstrap}: {text}"
            )
        if error.code() == KafkaError._SSL or any(mark in text for mark in _TLS_MARKS):
            return f"TLS handshake with Kafka at {bootstrap} failed: {text}"
    return None


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text.replace("\n", " ")


def kafka_or_exit(
    settings: KafkaClientSettings, prefix: str, *, command: str, timeout: float = 15.0
) -> None:
    """The start of every command that talks to Kafka: bootstrap set, credentials accepted.

    A missing bootstrap, or credentials or TLS settings the brokers refuse: one line on
    stderr and exit 2, as for any bad setting (retrying cannot fix either, and a crash loop
    with a clear line beats a pod that looks healthy and never consumes). No broker answering
    is an outage, not a mistake: logged, and the command's loop waits it out with backoff.
    """
    if not settings.kafka_bootstrap.strip():
        _exit_with(f"config error: {prefix}KAFKA_BOOTSTRAP: required by `{command}`")
    try:
        verify_connection(settings.kafka_connection(), timeout=timeout)
    except KafkaUnreachableError as exc:
        log_event(_log, "kafka unreachable at start", logging.WARNING, reason=str(exc))
    except KafkaSetupError as exc:
        _exit_with(f"config error: {prefix}KAFKA_*: {exc}")


def _exit_with(line: str) -> NoReturn:
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.stderr.flush()
    raise SystemExit(CONFIG_ERROR_EXIT_CODE)
