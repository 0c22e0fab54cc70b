"""A throw-away certificate authority and the PEM files a TLS-secured local broker needs.

Made at start with ``cryptography`` (no ``openssl`` or ``keytool`` invocations, no JVM start):
a CA, a broker certificate for the loopback names, and a client certificate for mutual TLS.
Kafka reads PEM key stores and trust stores directly (``ssl.keystore.type=PEM``), librdkafka
reads PEM files, so nothing needs converting.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pin_testkit.secured import ClientTls

__all__ = ["CertificateAuthority", "TlsFiles", "write_tls_files"]

LOOPBACK_NAMES: tuple[str, ...] = ("127.0.0.1", "localhost")
VALIDITY = datetime.timedelta(days=30)
# Tolerates a client whose clock is a little behind the machine that made the certificate.
BACKDATE = datetime.timedelta(hours=1)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pin-local"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_names(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for host in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(entries)


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def key_pem(self, password: str | None = None) -> bytes:
        """PKCS#8 PEM, encrypted with ``password`` when one is given."""
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password.encode())
            if password
            else serialization.NoEncryption()
        )
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )


class CertificateAuthority:
    """A self-signed CA (P-256) that issues server and client certificates."""

    def __init__(self, common_name: str = "pin-local test CA") -> None:
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        self.own = Issued(certificate, key)

    def issue(
        self, common_name: str, *, server: bool, hosts: Sequence[str] = LOOPBACK_NAMES
    ) -> Issued:
        """A leaf certificate: for a server (with ``hosts`` as subject alternative names) or
        for a client (its common name is the principal a broker sees with mutual TLS)."""
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.own.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.own.key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(_alt_names(hosts), critical=False)
        return Issued(builder.sign(self.own.key, hashes.SHA256()), key)


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """Paths of the PEM files of one secured broker and one client of it."""

    broker_keystore: Path  # broker key (PKCS#8) + certificate + CA, Kafka's PEM key store
    client: ClientTls  # its CA file is the broker's trust store too

    @classmethod
    def in_directory(cls, directory: Path, *, key_password: str, principal: str) -> TlsFiles:
        """Where `write_tls_files` puts them in `directory`."""
        return cls(
            broker_keystore=directory / "broker.pem",
            client=ClientTls(
                ca_file=directory / "ca.pem",
                client_certificate=directory / "client.pem",
                client_key=directory / "client.key",
                client_key_password=key_password,
                client_principal=principal,
            ),
        )

    @property
    def paths(self) -> tuple[Path, ...]:
        client = self.client
        return (client.ca_file, self.broker_keystore, client.client_certificate, client.client_key)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by the owner only (keys; the broker runs as the same user)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def write_tls_files(
    directory: Path,
    *,
    authority: CertificateAuthority | None = None,
    client_principal: str = "pin-client",
    hosts: Sequence[str] = LOOPBACK_NAMES,
) -> TlsFiles:
    """Make (or reuse the given) CA and write the broker's and a client's PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = authority or CertificateAuthority()
    broker = ca.issue("pin-local broker", server=True, hosts=hosts)
    client = ca.issue(client_principal, server=False)
    password = secrets.token_urlsafe(12)
    files = TlsFiles.in_directory(directory, key_password=password, principal=client_principal)
    files.client.ca_file.write_bytes(ca.own.certificate_pem())
    _write_private(
        files.broker_keystore,
        broker.key_pem() + broker.certificate_pem() + ca.own.certificate_pem(),
    )
    files.client.client_certificate.write_bytes(client.certificate_pem())
    _write_private(files.client.client_key, client.key_pem(password))
    return files
