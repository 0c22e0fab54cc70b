"""How a Kafka client authenticates: the settings and their librdkafka form. No client.

`KafkaClientSettings` refuses what would leak a password (SASL PLAIN over a connection without
TLS) unless explicitly allowed, and half-configured TLS client certificates. Every service's
`Settings` inherits it, so this module imports no Kafka client library: a command that never
talks to Kafka (the runbook commands) does not load librdkafka. The fail-fast check lives in
`kafka_security`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from pin_runtime.secret_files import SecretFileError, read_secret_file
from pin_runtime.settings import Secret

ConfigValue = str | int | float | bool
KafkaConfig = dict[str, ConfigValue]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_TLS_PROTOCOLS: Final = frozenset({"SSL", "SASL_SSL"})
_TLS_FILES: Final = (
    "kafka_ssl_ca_location",
    "kafka_ssl_certificate_location",
    "kafka_ssl_key_location",
)


SASL_PASSWORD_FILE: Final = "pin.sasl.password.file"  # noqa: S105 - a key, no password
"""Not a librdkafka setting: the file a config's `sasl.password` was read from
(`<PREFIX>KAFKA_SASL_PASSWORD_FILE`). pin_runtime's clients take it out before librdkafka
sees the config (`librdkafka_config`); `renewed_sasl_password` reads the file again."""


def librdkafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` as librdkafka takes it: without pin_runtime's own `SASL_PASSWORD_FILE`."""
    return {key: value for key, value in config.items() if key != SASL_PASSWORD_FILE}


def renewed_sasl_password(config: Mapping[str, ConfigValue]) -> KafkaConfig | None:
    """`config` with the SASL password its file holds now, when that is not the password
    `config` has; None when `config` reads no file or the file holds the same password.

    Asked when the brokers refused a client's login: a rotated password is taken by a
    client built again from the returned config. A file that cannot be read now raises
    `SecretFileError` (the old password goes on being tried)."""
    path = config.get(SASL_PASSWORD_FILE)
    if not isinstance(path, str):
        return None
    password = read_secret_file(path)
    if password == config.get("sasl.password"):
        return None
    return {**config, "sasl.password": password}


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


# A bootstrap server as librdkafka reads it: [protocol://]host[:port], the host a name, an
# IPv4 address or a bracketed IPv6 one. Anything else it only logs, retrying without end.
_SERVER: Final = re.compile(
    r"(?:[A-Za-z_]+://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?)"
    r"(?::(\d{1,5}))?"
)


_HIGHEST_PORT: Final = 65535


def _check_bootstrap(bootstrap: str) -> None:
    """A blank list is the commands' own check (`kafka_or_exit`: required by Kafka's)."""
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    if bootstrap.strip() and not servers:
        raise ValueError("KAFKA_BOOTSTRAP: expected a comma-separated list of host:port")
    for server in servers:
        if not _valid_server(server):
            raise ValueError(
                "KAFKA_BOOTSTRAP: expected a comma-separated list of host:port"
                f" (port 1..65535), got {server!r}"
            )


def _valid_server(server: str) -> bool:
    match = _SERVER.fullmatch(server)
    return match is not None and (
        match.group(1) is None or 1 <= int(match.group(1)) <= _HIGHEST_PORT
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
    """Required with a SASL_* protocol: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."""
    kafka_sasl_username: str | None = None
    kafka_sasl_password: Secret | None = None
    """Never logged or printed (`Secret`)."""
    kafka_sasl_password_file: str | None = None
    """A file holding the SASL password alone (a mounted Secret), instead of
    `kafka_sasl_password`: read when a client is built, and again when the brokers refuse its
    login, which rebuilds the client if the file holds a new password (no restart)."""
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
        _check_bootstrap(self.kafka_bootstrap)
        protocol = self.kafka_security_protocol
        if protocol.startswith("SASL"):
            for name in ("kafka_sasl_mechanism", "kafka_sasl_username"):
                if not getattr(self, name):
                    raise ValueError(f"{name.upper()}: required with {protocol}")
            if not (self.kafka_sasl_password or self.kafka_sasl_password_file):
                raise ValueError(
                    f"KAFKA_SASL_PASSWORD: required with {protocol} (or KAFKA_SASL_PASSWORD_FILE)"
                )
        if self.kafka_sasl_password is not None and self.kafka_sasl_password_file:
            raise ValueError(
                "KAFKA_SASL_PASSWORD_FILE: set with KAFKA_SASL_PASSWORD; set one of them"
            )
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

    def unreadable_tls_file(self) -> str | None:
        """The field of the first TLS file that is not a readable file here, else None.

        Not a check of the settings themselves (the same settings are rendered and checked
        where the files are not mounted): the commands that talk to Kafka ask it as they
        start (`kafka_security.kafka_or_exit`), because librdkafka reads the files when a
        client is made and refuses the whole client."""
        for name in _TLS_FILES:
            path = getattr(self, name)
            if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                return name
        return None

    def unreadable_sasl_password_file(self) -> str | None:
        """Why `kafka_sasl_password_file` gives no password, or None (also when unset):
        asked by the commands as they start (`kafka_security.kafka_or_exit`), as for the
        TLS files."""
        if not self.kafka_sasl_password_file:
            return None
        try:
            read_secret_file(self.kafka_sasl_password_file)
        except SecretFileError as exc:
            return str(exc)
        return None

    def kafka_security(self) -> KafkaConfig:
        """The librdkafka settings of this authentication, for every client's `extra`.

        With `kafka_sasl_password_file`, the password the file holds now, and the file
        itself under `SASL_PASSWORD_FILE` (`renewed_sasl_password` reads it again)."""
        password = self.kafka_sasl_password.reveal() if self.kafka_sasl_password else None
        path = self.kafka_sasl_password_file
        if path and self.kafka_security_protocol.startswith("SASL"):
            password = read_secret_file(path)
        config = security_config(
            protocol=self.kafka_security_protocol,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=password,
            ssl_ca_location=self.kafka_ssl_ca_location,
            ssl_certificate_location=self.kafka_ssl_certificate_location,
            ssl_key_location=self.kafka_ssl_key_location,
            ssl_key_password=(
                self.kafka_ssl_key_password.reveal() if self.kafka_ssl_key_password else None
            ),
            allow_plaintext_sasl_plain=self.kafka_allow_plaintext_sasl_plain,
        )
        if path and "sasl.password" in config:
            config[SASL_PASSWORD_FILE] = path
        return config

    def kafka_connection(self) -> KafkaConfig:
        """Bootstrap servers and authentication: what `verify_connection` needs."""
        return {"bootstrap.servers": self.kafka_bootstrap, **self.kafka_security()}
