"""The Kafka side of the operator's commands: whether a broker answers, asked once and
briefly as a command starts (`ToolKafka.reach`), and the command's clients, quiet.

A command answers within seconds when Kafka is down (docs/design/rewards-membership.md
"When a dependency is down"): the brokers get `KAFKA_WAIT` seconds to answer a metadata
request, then the command shows what the database alone can answer and says in one line
what it could not reach. Its clients log nothing of their own: librdkafka reports a broker
it cannot reach once per reconnect of every client, hundreds of lines in a few seconds that
bury the one that matters; the last error is kept instead (`ToolKafka.failure`) for the
command's one line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from pin_runtime.errors import KafkaSetupError, KafkaUnreachableError, SettingsError
from pin_runtime.kafka import ConfigValue, admin_config, consumer_config, verify_connection
from pin_runtime.kafka_settings import KafkaConfig, librdkafka_config
from pin_runtime.lag_watch.brokers import READER_CONFIG, Brokers
from rewards_membership.settings import ENV_PREFIX, SERVICE_NAME, Settings

__all__ = ["KAFKA_WAIT", "ToolKafka"]

KAFKA_WAIT: Final = 3.0
"""Seconds a command waits for a broker to answer before it answers without Kafka."""


@dataclass(eq=False)
class ToolKafka:
    """One command's way to Kafka: the check as it starts and its clients."""

    settings: Settings
    command: str
    """The command (`status`, `dlq list`, ...), named in a refusal of the settings."""
    last: KafkaError | None = field(default=None, init=False)
    """The last error a client of the command reported (none is logged)."""

    def reach(self, timeout: float = KAFKA_WAIT) -> str | None:
        """None once a broker answered a metadata request within `timeout`; else why not,
        in one line. Settings no retry can cure (no bootstrap, a TLS or password file that is
        not there, a login or handshake the brokers refuse) raise `SettingsError` at once,
        exit 2 naming the variable, as `kafka_or_exit` does for the long-lived commands."""
        settings = self.settings
        if not settings.kafka_bootstrap.strip():
            raise SettingsError(f"{ENV_PREFIX}KAFKA_BOOTSTRAP", f"required by `{self.command}`")
        refused = settings.unreadable_sasl_password_file()
        if refused is not None:
            raise SettingsError(f"{ENV_PREFIX}KAFKA_SASL_PASSWORD_FILE", refused)
        unreadable = settings.unreadable_tls_file()
        if unreadable is not None:
            path = getattr(settings, unreadable)
            raise SettingsError(
                f"{ENV_PREFIX}{unreadable.upper()}", f"no readable file at {path!r}"
            )
        try:
            verify_connection(settings.kafka_connection(), timeout=timeout)
        except KafkaUnreachableError as exc:
            return str(exc)
        except KafkaSetupError as exc:
            raise SettingsError(f"{ENV_PREFIX}KAFKA_*", str(exc)) from None
        return None

    def failure(self, exc: BaseException) -> str:
        """One line for a read that failed once the command had started: what failed, and
        the last error a client reported (why, usually)."""
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        what = error.str() if isinstance(error, KafkaError) else (str(exc) or type(exc).__name__)
        if self.last is not None and self.last.str() not in what:
            return f"{what} ({self.last.name()}: {self.last.str()})"
        return what

    def _seen(self, error: KafkaError) -> None:
        self.last = error

    def _quiet(self, config: Mapping[str, Any]) -> dict[str, Any]:
        # log_level 0: librdkafka's own lines would repeat the error callback's, per retry.
        return {**librdkafka_config(config), "error_cb": self._seen, "log_level": 0}

    def _extra(self, extra: Mapping[str, ConfigValue] | None = None) -> dict[str, ConfigValue]:
        return {**self.settings.kafka_security(), **(extra or {})}

    def consumer(
        self, client_id: str, *, group_id: str, extra: Mapping[str, ConfigValue] | None = None
    ) -> Consumer:
        """An assign-only consumer (the caller never subscribes nor commits with it)."""
        config = consumer_config(
            self.settings.kafka_bootstrap,
            group_id=group_id,
            client_id=client_id,
            extra=self._extra(extra),
        )
        return Consumer(self._quiet(config))

    def producer(self, config: KafkaConfig) -> Producer:
        return Producer(self._quiet(config))

    @contextmanager
    def brokers(self, *, timeout: float) -> Iterator[Brokers]:
        """The lag watcher's reads (`Brokers`) on this command's quiet clients."""
        client_id = f"{SERVICE_NAME}-status"
        bootstrap = self.settings.kafka_bootstrap
        admin = AdminClient(
            self._quiet(admin_config(bootstrap, client_id=client_id, extra=self._extra()))
        )
        # Its group id is never joined nor committed to (assign only): librdkafka wants one.
        reader = self.consumer(f"{client_id}-reader", group_id=client_id, extra=READER_CONFIG)
        brokers = Brokers(
            admin=admin,
            reader=reader,
            offsets_reader=lambda group: self.consumer(f"{client_id}-offsets", group_id=group),
            timeout=timeout,
        )
        try:
            yield brokers
        finally:
            brokers.close()
            reader.close()
