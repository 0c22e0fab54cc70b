"""How a client reaches a secured test broker: addresses, the CA, SCRAM and mTLS credentials;
and how a test takes a permission away from its SCRAM user and gives it back (ACLs)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

# Re-exported by confluent_kafka.admin without __all__; mypy strict wants the defining modules.
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from confluent_kafka.admin._scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.x509.oid import NameOID

from pin_testkit.service import run_cli, service_environment

__all__ = [
    "ENVIRONMENT",
    "ClientTls",
    "ScramLogin",
    "SecuredKafka",
    "TopicAcls",
    "assert_wrong_password_refused",
]

# What `pin-local env` exports for a secured local broker, and `secured_kafka` reads.
ENVIRONMENT: tuple[str, ...] = (
    "PIN_KAFKA_SECURE_BOOTSTRAP",  # SASL_SSL listener
    "PIN_KAFKA_MTLS_BOOTSTRAP",  # SSL listener that requires a client certificate
    "PIN_KAFKA_SASL_USERNAME",
    "PIN_KAFKA_SASL_PASSWORD",
    "PIN_KAFKA_SSL_CA_LOCATION",
    "PIN_KAFKA_SSL_CERTIFICATE_LOCATION",
    "PIN_KAFKA_SSL_KEY_LOCATION",
    "PIN_KAFKA_SSL_KEY_PASSWORD",
)
PLAINTEXT_VARIABLE = "PIN_KAFKA_BOOTSTRAP"

ConfigValue = str | int | float | bool
WRONG_PASSWORD_WITHIN = 30.0
"""Seconds a service may take to refuse a wrong password (it must not retry it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientTls:
    """What a client of a secured broker trusts and proves itself with (PEM files)."""

    ca_file: Path  # the CA certificate: every client's ssl.ca.location
    client_certificate: Path  # a client certificate signed by the CA (mutual TLS)
    client_key: Path  # its key, PKCS#8 PEM encrypted with client_key_password
    client_key_password: str = field(repr=False)
    client_principal: str  # the common name of the client certificate


@dataclass(frozen=True, slots=True)
class SecuredKafka:
    """The secured listeners of one broker and a valid identity for each.

    ``bootstrap`` is the SASL_SSL listener (TLS, then SCRAM with ``username``/``password``);
    ``mtls_bootstrap`` the SSL listener that requires a client certificate signed by the CA
    (``tls``); ``plaintext_bootstrap`` the broker's own
    unauthenticated loopback listener, for test set-up only (creating topics).
    """

    bootstrap: str
    mtls_bootstrap: str
    plaintext_bootstrap: str
    username: str
    password: str = field(repr=False)
    tls: ClientTls
    mechanism: str = "SCRAM-SHA-512"

    def sasl_config(self, **overrides: ConfigValue) -> dict[str, ConfigValue]:
        """librdkafka settings of a SCRAM client over TLS (``overrides`` win)."""
        config: dict[str, ConfigValue] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.mechanism,
            "sasl.username": self.username,
            "sasl.password": self.password,
            "ssl.ca.location": str(self.tls.ca_file),
        }
        return config | overrides

    def mtls_config(self, **overrides: ConfigValue) -> dict[str, ConfigValue]:
        """librdkafka settings of a client authenticated by its certificate alone."""
        config: dict[str, ConfigValue] = {
            "bootstrap.servers": self.mtls_bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.tls.ca_file),
            "ssl.certificate.location": str(self.tls.client_certificate),
            "ssl.key.location": str(self.tls.client_key),
            "ssl.key.password": self.tls.client_key_password,
        }
        return config | overrides

    def environment(self, prefix: str) -> dict[str, str]:
        """The ``<PREFIX>KAFKA_*`` variables of a service's settings for the SCRAM listener."""
        return {
            f"{prefix}KAFKA_BOOTSTRAP": self.bootstrap,
            f"{prefix}KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            f"{prefix}KAFKA_SASL_MECHANISM": self.mechanism,
            f"{prefix}KAFKA_SASL_USERNAME": self.username,
            f"{prefix}KAFKA_SASL_PASSWORD": self.password,
            f"{prefix}KAFKA_SSL_CA_LOCATION": str(self.tls.ca_file),
        }

    def exported(self) -> dict[str, str]:
        """The ``PIN_KAFKA_*`` variables that describe this broker (see ``from_environment``)."""
        values = (
            self.bootstrap,
            self.mtls_bootstrap,
            self.username,
            self.password,
            str(self.tls.ca_file),
            str(self.tls.client_certificate),
            str(self.tls.client_key),
            self.tls.client_key_password,
        )
        return dict(zip(ENVIRONMENT, values, strict=True))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> SecuredKafka | None:
        """The secured broker ``pin-local env`` described, or None when it described none."""
        if not environ.get(ENVIRONMENT[0]):
            return None
        missing = [name for name in (*ENVIRONMENT, PLAINTEXT_VARIABLE) if not environ.get(name)]
        if missing:
            raise ValueError(f"{ENVIRONMENT[0]} is set but not {', '.join(missing)}")
        (bootstrap, mtls, user, password, ca, certificate, key, key_password) = (
            environ[name] for name in ENVIRONMENT
        )
        return cls(
            bootstrap=bootstrap,
            mtls_bootstrap=mtls,
            plaintext_bootstrap=environ[PLAINTEXT_VARIABLE],
            username=user,
            password=password,
            tls=ClientTls(
                ca_file=Path(ca),
                client_certificate=Path(certificate),
                client_key=Path(key),
                client_key_password=key_password,
                client_principal=_common_name(Path(certificate)),
            ),
        )


@dataclass(frozen=True, slots=True)
class TopicAcls:
    """A DENY ACL of the SCRAM user on one topic, added and deleted again.

    The secured broker enforces ACLs and allows everything on a resource without any
    (``allow.everyone.if.no.acl.found``), so a DENY takes exactly that permission away and
    deleting it gives the permission back. Sent as ANONYMOUS over the broker's loopback
    PLAINTEXT listener, a super user. Effective on the single-node broker within ~1 s.
    """

    secured: SecuredKafka
    topic: str
    operation: AclOperation = AclOperation.WRITE

    def deny(self) -> None:
        """The user may no longer do ``operation`` on ``topic`` (its requests are refused)."""
        admin = self._admin()  # held until the futures are done: its end cancels them
        for future in admin.create_acls([AclBinding(*self._deny_rule())]).values():
            future.result(timeout=30)

    def allow_again(self) -> None:
        """Delete the DENY again: the user's permission is back."""
        admin = self._admin()
        for future in admin.delete_acls([AclBindingFilter(*self._deny_rule())]).values():
            future.result(timeout=30)

    def _deny_rule(self) -> tuple[Any, ...]:
        """The DENY, as both an ACL binding and the filter matching it take it."""
        return (
            ResourceType.TOPIC,
            self.topic,
            ResourcePatternType.LITERAL,
            f"User:{self.secured.username}",
            "*",
            self.operation,
            AclPermissionType.DENY,
        )

    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.secured.plaintext_bootstrap, "log_level": 0})


@dataclass(frozen=True, slots=True)
class ScramLogin:
    """A SCRAM user of a test's own on the secured broker, whose password the test rotates
    (the broker's own user is shared by every test of the run, so never rotated).

    Set as ANONYMOUS over the broker's loopback PLAINTEXT listener, a super user; the user
    may do everything a resource without ACLs allows (``allow.everyone.if.no.acl.found``).
    A changed password refuses new logins at once; connections already authenticated stay.
    """

    secured: SecuredKafka
    name: str

    def set_password(self, password: str) -> None:
        """Create the user, or change its password, for every SCRAM mechanism the broker
        takes (the one the services use among them)."""
        alterations: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                self.name, ScramCredentialInfo(mechanism, 4096), password.encode()
            )
            for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256)
        ]
        self._alter(alterations)

    def delete(self) -> None:
        """The user's credentials gone: it logs in no more."""
        self._alter(
            [
                UserScramCredentialDeletion(self.name, mechanism)
                for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256)
            ]
        )

    def environment(self, prefix: str, password_file: Path) -> dict[str, str]:
        """The ``<PREFIX>KAFKA_*`` variables of a service logging in as this user with its
        password read from ``password_file`` (``<PREFIX>KAFKA_SASL_PASSWORD_FILE``)."""
        env = self.secured.environment(prefix)
        del env[f"{prefix}KAFKA_SASL_PASSWORD"]
        return env | {
            f"{prefix}KAFKA_SASL_USERNAME": self.name,
            f"{prefix}KAFKA_SASL_PASSWORD_FILE": str(password_file),
        }

    def _alter(self, alterations: list[UserScramCredentialAlteration]) -> None:
        admin = AdminClient({"bootstrap.servers": self.secured.plaintext_bootstrap, "log_level": 0})
        for alteration in alterations:  # the broker takes one alteration per user a request
            for future in admin.alter_user_scram_credentials([alteration]).values():
                future.result(timeout=30)


def _common_name(certificate: Path) -> str:
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


def assert_wrong_password_refused(
    secured: SecuredKafka, program: str, args: Sequence[str], prefix: str, **settings: str
) -> None:
    """`program args` with every `<prefix>KAFKA_*` setting of `secured` but a wrong SASL
    password (plus `<prefix><name>` of `settings`) stops at once: exit code 2, a last line
    naming the failed authentication and the user, and neither password in its output."""
    wrong = f"wrong-{uuid.uuid4().hex}"
    env = (
        service_environment((prefix,))
        | secured.environment(prefix)
        | {f"{prefix}{name}": value for name, value in settings.items()}
        | {f"{prefix}KAFKA_SASL_PASSWORD": wrong}
    )
    started = time.monotonic()
    result = run_cli(program, list(args), env, timeout=60, check=False)
    took = time.monotonic() - started
    last = (result.stderr.strip().splitlines() or [""])[-1]
    expected = (
        f"config error: {prefix}KAFKA_*: Kafka authentication failed for user '{secured.username}'"
    )
    if result.returncode != 2 or not last.startswith(expected):  # noqa: PLR2004 - config error
        raise AssertionError(f"exit {result.returncode}, not 2 with {expected!r}:\n{result.stderr}")
    if took >= WRONG_PASSWORD_WITHIN:
        raise AssertionError(f"took {took:.1f}s to refuse a wrong password")
    outputs = (result.stdout, result.stderr)
    if any(text in output for text in (wrong, secured.password) for output in outputs):
        raise AssertionError(f"a password in the output:\n{result.stderr}")
