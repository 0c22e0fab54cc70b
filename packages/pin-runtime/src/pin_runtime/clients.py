"""The settings every service inherits: Kafka connection and database session limits
(`ClientSettings`), plus the process's own (`ServiceSettings`: metrics port, log level,
runtime role prefix).

A service's `Settings` subclasses `ServiceSettings`, so `<PREFIX>KAFKA_BOOTSTRAP`,
`<PREFIX>DB_STATEMENT_TIMEOUT`, `<PREFIX>LOG_LEVEL` and friends mean the same thing in every
service.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from msgspec import Meta

from pin_runtime.db_roles import check_role_prefix
from pin_runtime.kafka_settings import KafkaClientSettings
from pin_runtime.logging import LogLevel
from pin_runtime.postgres import (
    DsnError,
    SessionLimitError,
    SessionLimits,
    check_dsn,
    dsn_has_password,
)
from pin_runtime.settings import Secret

__all__ = ["ClientSettings", "Port", "ServiceSettings"]

KeepaliveCount = Annotated[int, Meta(ge=1, le=100)]
Port = Annotated[int, Meta(ge=0, le=65535)]

# The defaults of the settings below are the sessions' own.
_SESSION = SessionLimits()


class ClientSettings(KafkaClientSettings, frozen=True, kw_only=True):
    """Kafka settings (inherited) plus the limits of every database session (`SessionLimits`)."""

    db_statement_timeout: timedelta = timedelta(seconds=_SESSION.statement_timeout)
    """Longest statement; a statement over it fails (57014) and its unit of work is retried."""
    db_lock_timeout: timedelta = timedelta(seconds=_SESSION.lock_timeout)
    """Longest wait for a row or table lock (55P03, retried)."""
    db_idle_in_transaction_timeout: timedelta = timedelta(
        seconds=_SESSION.idle_in_transaction_timeout
    )
    """The server ends a session whose transaction stays idle this long (a stuck process)."""
    db_keepalives_idle: timedelta = timedelta(seconds=_SESSION.keepalives_idle)
    """TCP keepalive: idle time before the first probe, on both ends of the connection."""
    db_keepalives_interval: timedelta = timedelta(seconds=_SESSION.keepalives_interval)
    db_keepalives_count: KeepaliveCount = _SESSION.keepalives_count

    def __post_init__(self) -> None:
        super().__post_init__()  # the Kafka authentication checks
        try:
            self.database_session()  # the limits' ranges are SessionLimits' own
        except SessionLimitError as exc:
            raise ValueError(f"DB_{exc.limit.upper()}: {exc.requirement}") from None

    def database_session(self) -> SessionLimits:
        """The `SessionLimits` of every database session the service opens."""
        return SessionLimits(
            statement_timeout=self.db_statement_timeout.total_seconds(),
            lock_timeout=self.db_lock_timeout.total_seconds(),
            idle_in_transaction_timeout=self.db_idle_in_transaction_timeout.total_seconds(),
            keepalives_idle=int(self.db_keepalives_idle.total_seconds()),
            keepalives_interval=int(self.db_keepalives_interval.total_seconds()),
            keepalives_count=self.db_keepalives_count,
        )


class ServiceSettings(ClientSettings, frozen=True, kw_only=True):
    """The client settings plus what every service process has: its metrics listener, its
    log level and the prefix of its runtime database roles. A service overrides
    `metrics_port` with its own default."""

    database_dsn: Secret | None = None
    """libpq DSN of the service's database: a service's `Settings` makes it required. It is
    parsed at start, so a malformed one stops the process (exit 2) instead of reading as a
    database that is down."""
    database_password_file: str | None = None
    """A file holding the database password alone (a mounted Secret), read at every connect
    (`postgres.LoginConnection`): a rewritten file is taken by the next session, no restart.
    Any file mode; the DSN then carries no password. Checked readable as a command starts."""
    metrics_host: str = "0.0.0.0"  # noqa: S104 - the pod's metrics port is meant to be scraped
    metrics_port: Port = 0
    log_level: LogLevel = "INFO"
    db_role_prefix: str = ""
    """Read by `migrate` alone: the runtime roles it creates and grants to are named this
    prefix + their name (each service's docs/design "Database roles"), e.g. `staging_` when one
    cluster holds
    several installations (roles are cluster-wide)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.database_dsn is not None:
            try:
                check_dsn(self.database_dsn.reveal())
            except DsnError as exc:
                raise ValueError(f"DATABASE_DSN: {exc}") from None
            if self.database_password_file and dsn_has_password(self.database_dsn.reveal()):
                raise ValueError(
                    "DATABASE_PASSWORD_FILE: the DATABASE_DSN carries a password too; "
                    "set one of them"
                )
        try:
            check_role_prefix(self.db_role_prefix)
        except ValueError as exc:
            raise ValueError(f"DB_ROLE_PREFIX: {exc}") from None
