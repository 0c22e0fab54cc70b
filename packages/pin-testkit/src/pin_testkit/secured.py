"""How a client reaches a secured test broker: addresses, the CA, SCRAM and mTLS credentials."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SecuredKafka"]

ConfigValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class SecuredKafka:
    """The secured listeners of one broker and a valid identity for each.

    ``bootstrap`` is the SASL_SSL listener (TLS, then SCRAM with ``username``/``password``);
    ``mtls_bootstrap`` the SSL listener that requires a client certificate signed by the CA
    (``client_certificate``/``client_key``); ``plaintext_bootstrap`` the broker's own
    unauthenticated loopback listener, for test set-up only (creating topics).
    """

    bootstrap: str
    mtls_bootstrap: str
    plaintext_bootstrap: str
    username: str
    password: str = field(repr=False)
    ca_file: Path
    client_certificate: Path
    client_key: Path
    client_key_password: str = field(repr=False)
    client_principal: str
    mechanism: str = "SCRAM-SHA-512"

    def sasl_config(self, **overrides: ConfigValue) -> dict[str, ConfigValue]:
        """librdkafka settings of a SCRAM client over TLS (``overrides`` win)."""
        config: dict[str, ConfigValue] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": self.mechanism,
            "sasl.username": self.username,
            "sasl.password": self.password,
            "ssl.ca.location": str(self.ca_file),
        }
        return config | overrides

    def mtls_config(self, **overrides: ConfigValue) -> dict[str, ConfigValue]:
        """librdkafka settings of a client authenticated by its certificate alone."""
        config: dict[str, ConfigValue] = {
            "bootstrap.servers": self.mtls_bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca_file),
            "ssl.certificate.location": str(self.client_certificate),
            "ssl.key.location": str(self.client_key),
            "ssl.key.password": self.client_key_password,
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
            f"{prefix}KAFKA_SSL_CA_LOCATION": str(self.ca_file),
        }
