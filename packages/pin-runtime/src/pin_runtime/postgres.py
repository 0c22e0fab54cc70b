"""PostgreSQL connections and pool, LISTEN/NOTIFY, and the one place psycopg errors are
classified.

`is_retriable` splits failures into infrastructure (wait, back off, retry the unit of work)
and bugs (stop, or dead-letter the input): retrying a bug loops forever, giving up on an
outage loses work.
"""

from __future__ import annotations

import getpass
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Self

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout, TooManyRequests

from pin_runtime.errors import PinRuntimeError, TemplatedError
from pin_runtime.logging import log_event
from pin_runtime.secret_files import SecretFileError, read_secret_file
from pin_runtime.sql import load_queries

__all__ = [
    "AUTH_FAILURE_SQLSTATES",
    "CONNECT_TIMEOUT",
    "PINNED_SETTINGS",
    "RETRIABLE_SQLSTATES",
    "RETRIABLE_SQLSTATE_CLASSES",
    "DatabaseAuthError",
    "DsnError",
    "LazyConnection",
    "LoginConnection",
    "Pool",
    "SessionLimitError",
    "SessionLimits",
    "auth_failure",
    "causes",
    "check_dsn",
    "check_login",
    "connect",
    "create_pool",
    "dsn_has_password",
    "is_retriable",
    "listen",
    "login_of",
    "notify",
    "read_password_from",
]

_log = logging.getLogger(__name__)
_channels = load_queries("pin_runtime", "queries/channels.sql")

Pool = ConnectionPool[psycopg.Connection[TupleRow]]
Connection = psycopg.Connection[TupleRow]
CONNECT_TIMEOUT: Final = 5
"""Seconds a connect may take: libpq waits forever on an unreachable host by default."""

# Whole SQLSTATE classes that mean "the server or the path to it is in trouble".
RETRIABLE_SQLSTATE_CLASSES: Final = {
    "08": "connection exception (refused, lost, protocol)",
    "53": "insufficient resources (too many connections 53300, disk full, out of memory)",
    "57": "operator intervention (admin/crash shutdown 57P01-57P03, query canceled 57014)",
    "58": "system error (I/O error)",
}
# Single states outside those classes: a retry of the same transaction can succeed.
RETRIABLE_SQLSTATES: Final = {
    "40001": "serialization failure",
    "40P01": "deadlock detected",
    "55P03": "lock not available (lock_timeout / NOWAIT)",
    "25P03": "idle-in-transaction session timeout (the server closed the session)",
    "25006": "read-only transaction (a standby promoted or demoted under us after failover)",
}


# A refused login (SQLSTATE class 28): retriable like an outage (a rotated password or a
# rewritten passfile heals it without a restart), but told apart (`auth_failure`): it needs
# an operator, and at a command's start it is a bad setting (exit 2), not an outage.
AUTH_FAILURE_SQLSTATES: Final = {
    "28P01": "invalid_password",
    "28000": "invalid_authorization_specification",
}
# libpq reports a refused connect without its SQLSTATE (there is no result to carry one),
# so the server's FATAL line (and libpq's own "no password supplied") is what tells it;
# a server whose lc_messages is not English words these differently and goes unclassified.
_AUTH_FAILURE_TEXTS: Final = (
    (re.compile(r"password authentication failed|no password supplied"), "28P01"),
    (
        re.compile(
            r"no pg_hba\.conf entry|pg_hba\.conf rejects connection|authentication failed for user"
            r'|role "[^"]*" (?:does not exist|is not permitted to log in)'
        ),
        "28000",
    ),
)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then each exception it was raised `from` (explicit `raise X from psycopg_error`
    wrappers), once each: a cycle in the chain ends the walk."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def is_retriable(exc: BaseException) -> bool:
    """True when `exc` (or an exception it was raised `from`) is an infrastructure failure."""
    for current in causes(exc):
        verdict = _classify(current)
        if verdict is not None:
            return verdict
    return False


def auth_failure(exc: BaseException) -> str | None:
    """The SQLSTATE (28P01 or 28000) when `exc`, or an exception it was raised `from`, is
    PostgreSQL refusing the login; None for anything else."""
    for current in causes(exc):
        if isinstance(current, DatabaseAuthError):
            return current.sqlstate
        if not isinstance(current, psycopg.Error):
            continue
        if current.sqlstate in AUTH_FAILURE_SQLSTATES:
            return current.sqlstate
        if current.sqlstate is None and isinstance(current, psycopg.OperationalError):
            for pattern, sqlstate in _AUTH_FAILURE_TEXTS:
                if pattern.search(str(current)):
                    return sqlstate
    return None


class DatabaseAuthError(PinRuntimeError, TemplatedError):
    """PostgreSQL refused the login of `user` at `host` (never the password)."""

    template = "the database refused the login of user {user} at {host} ({sqlstate} {name})"
    user: str
    host: str
    sqlstate: str

    @property
    def name(self) -> str:
        return AUTH_FAILURE_SQLSTATES.get(self.sqlstate, "authentication failed")

    def describe(self) -> str:
        return self.template.format(
            user=self.user, host=self.host, sqlstate=self.sqlstate, name=self.name
        )


def login_of(dsn: str) -> tuple[str, str]:
    """The user and host a DSN logs in as and to, for a log line (never its password):
    libpq's defaults where the DSN names none (PGUSER, PGHOST, the OS user, the socket)."""
    try:
        options = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        options = {}
    user = str(options.get("user") or os.environ.get("PGUSER") or getpass.getuser())
    host = str(options.get("host") or options.get("hostaddr") or os.environ.get("PGHOST") or "")
    port = str(options.get("port") or os.environ.get("PGPORT") or "")
    where = host or "local socket"
    return user, f"{where}:{port}" if port and host else where


def dsn_has_password(dsn: str) -> bool:
    """Whether the DSN carries a password of its own (`password=`, or a URL's user:pw@)."""
    try:
        return bool(conninfo_to_dict(dsn).get("password"))
    except psycopg.ProgrammingError:
        return False


def report_auth_failure(
    exc: BaseException,
    dsn: str,
    count: Callable[[], object],
    *,
    log: logging.Logger = _log,
    **fields: Any,
) -> DatabaseAuthError | None:
    """`database authentication failed` (ERROR: the user and host of `dsn`, the SQLSTATE,
    never the password), counted by `count`, when `exc` is PostgreSQL refusing the login
    (`auth_failure`); None, nothing logged, for anything else.

    The one line every long-running process logs for a refused login while it runs (a
    password rotated under it, a wrong Secret), so one alert query and one runbook serve
    them all; `log`: the caller's logger (the line is its component's); `fields` add the
    caller's own (the relay's retry delay)."""
    sqlstate = auth_failure(exc)
    if sqlstate is None:
        return None
    count()
    user, host = login_of(dsn)
    refused = DatabaseAuthError(user, host, sqlstate)
    log_event(
        log,
        "database authentication failed",
        logging.ERROR,
        user=user,
        host=host,
        sqlstate=sqlstate,
        error=str(refused),
        **fields,
    )
    return refused


def check_login(dsn: str, session: SessionLimits) -> None:
    """The start of a long-lived command: one connect, to refuse a login the server rejects.

    Raises `DatabaseAuthError` for a refused login (a bad setting: `run_command` exits 2
    naming the DSN's variable, as for credentials the brokers refuse); a server that does not
    answer is an outage the command's loops wait out, so that is logged and not raised."""
    try:
        connect(dsn, session).close()
    except psycopg.OperationalError as exc:
        sqlstate = auth_failure(exc)
        if sqlstate is not None:
            user, host = login_of(dsn)
            raise DatabaseAuthError(user, host, sqlstate) from None
        log_event(
            _log,
            "database unreachable at start",
            logging.WARNING,
            error=(str(exc).strip().splitlines() or [type(exc).__name__])[0],
        )


def _classify(exc: BaseException) -> bool | None:
    if isinstance(exc, PoolClosed):
        return False  # using a closed pool is a lifecycle bug (or shutdown), not an outage
    if isinstance(exc, PoolTimeout | TooManyRequests):
        return True  # every connection busy or the server unreachable for `timeout`
    if isinstance(exc, psycopg.Error):
        sqlstate = exc.sqlstate
        if sqlstate is None:
            # Client-side: connection refused/lost/timeout are OperationalError; the rest
            # (closed cursor, wrong parameter count) are misuse.
            return isinstance(exc, psycopg.OperationalError)
        return sqlstate in RETRIABLE_SQLSTATES or sqlstate[:2] in RETRIABLE_SQLSTATE_CLASSES
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return None


PINNED_SETTINGS: Final[Mapping[str, str]] = {
    # psycopg parses dates and intervals only in these styles ('SQL, DMY' is refused).
    "DateStyle": "ISO,YMD",
    "IntervalStyle": "postgres",
    # Timestamps read as UTC: no session offset renders a year-9999 value as 10000.
    "TimeZone": "UTC",
    "client_encoding": "UTF8",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "standard_conforming_strings": "on",
    # Every name in the services' SQL is schema-qualified; built-ins come from pg_catalog
    # first, and a temporary object never shadows one.
    "search_path": "pg_catalog,pg_temp",
    # The claims, the checkpoints and the version guard are written for READ COMMITTED,
    # and a unit of work writes.
    "default_transaction_isolation": "read\\ committed",
    "default_transaction_read_only": "off",
    "transform_null_equals": "off",
    # A pooled connection waits idle by design; the server must not end it for that.
    "idle_session_timeout": "0",
}
"""Server settings every session pins, whatever the database's or the role's defaults."""


_LONGEST_TIMEOUT_MS: Final = 2**31 - 1
"""statement_timeout and its kin are int milliseconds: the server refuses more, and a
session that cannot start looks exactly like a server that is down."""
_LONGEST_KEEPALIVE_S: Final = 32767
_MOST_KEEPALIVE_PROBES: Final = 127
"""Linux's TCP_KEEPIDLE/TCP_KEEPINTVL and TCP_KEEPCNT limits: libpq's setsockopt fails on
more, and so does every connect."""


class SessionLimitError(PinRuntimeError, TemplatedError, ValueError):
    """A `SessionLimits` value out of its range; `limit` names the field."""

    template = "{limit}: {requirement}"
    limit: str
    requirement: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionLimits:
    """Bounds on every wait of a database session, set when it connects.

    A statement blocked by a lock or a slow plan fails (SQLSTATE 55P03 / 57014, both
    retriable) instead of stalling its loop; a transaction left open by a stuck process is
    ended by the server; TCP keepalives on both ends notice a vanished peer in about
    idle + interval * count seconds instead of the kernel's two hours (which is also how
    fast an advisory lock of a dead process is freed). Durations in seconds; 0 disables.
    """

    statement_timeout: float = 30.0
    """The server cancels a statement running longer (57014)."""
    lock_timeout: float = 10.0
    """A statement waiting longer for a lock fails (55P03)."""
    idle_in_transaction_timeout: float = 60.0
    """The server ends a session idle this long inside a transaction."""
    keepalives_idle: int = 10
    """Seconds of silence before the first TCP keepalive probe (both ends)."""
    keepalives_interval: int = 5
    keepalives_count: int = 3
    """Unanswered probes, `keepalives_interval` apart, after which the peer is gone."""

    def __post_init__(self) -> None:
        for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_timeout"):
            if not 0 <= _ms(getattr(self, name)) <= _LONGEST_TIMEOUT_MS:
                raise SessionLimitError(
                    name, "must be from 0 (disabled) to 24d20h31m23.647s (the server's limit)"
                )
        for name in ("keepalives_idle", "keepalives_interval"):
            if not 1 <= getattr(self, name) <= _LONGEST_KEEPALIVE_S:
                raise SessionLimitError(name, "must be from 1s to 32767s (the kernel's limit)")
        if not 1 <= self.keepalives_count <= _MOST_KEEPALIVE_PROBES:
            raise SessionLimitError(
                "keepalives_count", "must be from 1 to 127 (the kernel's limit)"
            )

    def options(self) -> str:
        """The libpq `options` string: server settings of the session, from its start.

        The limits above, and `PINNED_SETTINGS`: a session's options outrank every default
        of the server, the database and the role (`ALTER ... SET`), so none of them can
        change how a statement reads or what the driver parses.
        """
        settings: dict[str, object] = {
            **PINNED_SETTINGS,
            "statement_timeout": _ms(self.statement_timeout),
            "lock_timeout": _ms(self.lock_timeout),
            "idle_in_transaction_session_timeout": _ms(self.idle_in_transaction_timeout),
            "tcp_keepalives_idle": self.keepalives_idle,
            "tcp_keepalives_interval": self.keepalives_interval,
            "tcp_keepalives_count": self.keepalives_count,
        }
        return " ".join(f"-c {name}={value}" for name, value in settings.items())

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `psycopg.connect` (or a pool's `kwargs`) for these limits."""
        return {
            "options": self.options(),
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle,
            "keepalives_interval": self.keepalives_interval,
            "keepalives_count": self.keepalives_count,
        }


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class DsnError(PinRuntimeError, ValueError):
    """A DSN libpq would refuse at every connect: a setting to fix, not an outage to wait
    out. The message never quotes the DSN (it may carry a password)."""


# Values libpq checks only when it connects (and then fails every attempt alike).
_DSN_CHOICES: Final[Mapping[str, frozenset[str]]] = {
    "sslmode": frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}),
    "gssencmode": frozenset({"disable", "prefer", "require"}),
    "channel_binding": frozenset({"disable", "prefer", "require"}),
    "target_session_attrs": frozenset(
        {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}
    ),
    "load_balance_hosts": frozenset({"disable", "random"}),
    "sslcertmode": frozenset({"disable", "allow", "require"}),
    "sslnegotiation": frozenset({"postgres", "direct"}),
    "ssl_min_protocol_version": frozenset({"TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"}),
    "ssl_max_protocol_version": frozenset({"TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"}),
}
_DSN_INTEGERS: Final = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)
# How libpq words a string it cannot parse, told in words that quote none of it.
_DSN_SYNTAX: Final = (
    ("unterminated quoted string", "a quoted value is not closed"),
    ('missing "="', "a word without '=' (key=value pairs or a postgresql:// URL)"),
    ("percent-encoded", "an invalid %-escape in the URL"),
    ("URI", "not a valid postgresql:// URL"),
)


def check_dsn(dsn: str) -> None:
    """Raise `DsnError` for a DSN no connect can succeed with: one libpq cannot parse, an
    unknown option, or a value libpq refuses (a port that is no number, an unknown sslmode).
    A server that cannot be reached is not checked here: that is waited out."""
    try:
        options = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        text = str(exc)
        unknown = re.match(r'invalid (?:connection option|URI query parameter):? "(\w+)"', text)
        if unknown:
            raise DsnError(f"unknown connection option {unknown.group(1)!r}") from None
        for mark, words in _DSN_SYNTAX:
            if mark in text:
                raise DsnError(words) from None
        raise DsnError("not a valid libpq connection string") from None
    for name, choices in _DSN_CHOICES.items():
        value = options.get(name)
        if value is not None and value not in choices:
            raise DsnError(f"{name} must be one of {', '.join(sorted(choices))}")
    for name in _DSN_INTEGERS:
        value = options.get(name)
        if value is not None and not re.fullmatch(r"\s*-?\d+\s*", str(value)):
            raise DsnError(f"{name} must be a whole number")
    _check_hosts(options)


_HIGHEST_PORT: Final = 65535


def _check_hosts(options: Mapping[str, Any]) -> None:
    hosts = str(options.get("host") or "").split(",")
    addresses = str(options.get("hostaddr") or "").split(",")
    ports = str(options.get("port") or "").split(",")
    for port in ports:
        if port.strip() and not (port.strip().isdigit() and 1 <= int(port) <= _HIGHEST_PORT):
            raise DsnError("port must be a number from 1 to 65535 (one per host)")
    for address in addresses:
        if address.strip():
            try:
                ipaddress.ip_address(address.strip())
            except ValueError:
                raise DsnError("hostaddr must be a numeric IP address (one per host)") from None
    count = max(len(hosts), len(addresses))
    if len(ports) not in (1, count):
        raise DsnError(f"{len(ports)} ports for {count} hosts: give one port, or one per host")
    if options.get("hostaddr") and options.get("host") and len(addresses) != len(hosts):
        raise DsnError("host and hostaddr must list the same number of entries")


# The password file of a DSN (`<PREFIX>DATABASE_PASSWORD_FILE`), by the DSN's exact text:
# every connection here is made from the settings' DSN as it is, and a test process that
# runs several configurations keeps each one's file to its own DSN.
_password_files: dict[str, str] = {}


def read_password_from(dsn: str, path: str | None) -> None:
    """From now on, every connection to `dsn` opened here logs in with the password `path`
    holds, read at each connect (`LoginConnection`); None: the DSN's own (or libpq's).

    Called once as a command starts (`composition.Cli`), after the file was found readable:
    a rotated password written to the file is then taken by the next session the pool, a
    loop's `LazyConnection` or a probe opens, with no restart."""
    if path is None:
        _password_files.pop(dsn, None)
    else:
        _password_files[dsn] = path


class LoginConnection(psycopg.Connection[TupleRow]):
    """psycopg's connection whose `connect` reads the password file registered for its DSN
    (`read_password_from`) at every connect: the class of the pools and of every connection
    the services open.

    A file that cannot be read at that moment (a Secret volume being swapped) fails the
    connect as an outage does (OperationalError, retried), naming the file, never the
    password."""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        """`on_refused` (a keyword of ours, never libpq's; `OnRefused`): told of a connect
        PostgreSQL refused the login of (`auth_failure`) before it is raised; a pool's own
        connects are retried out of its user's sight (its `getconn` times out without their
        cause), so this is where they are seen."""
        on_refused: OnRefused | None = kwargs.pop("on_refused", None)
        path = _password_files.get(conninfo)
        if path is not None:
            try:
                kwargs["password"] = read_secret_file(path)
            except SecretFileError as exc:
                raise psycopg.OperationalError(f"database password file: {exc}") from None
        try:
            return super().connect(conninfo, **kwargs)
        except psycopg.OperationalError as exc:
            if on_refused is not None and auth_failure(exc) is not None:
                on_refused(exc)
            raise


OnRefused = Callable[[psycopg.OperationalError], object]
"""Told of a connect whose login PostgreSQL refused (`LoginConnection`): a long-running
process's `report_auth_failure` with its counter."""


def connect(
    dsn: str,
    session: SessionLimits,
    *,
    application_name: str | None = None,
    on_refused: OnRefused | None = None,
) -> Connection:
    """One autocommit connection bounded by `session`, its connect too.

    Autocommit: every unit of work opens its own `conn.transaction()`, which then is a real
    BEGIN/COMMIT and never a savepoint inside an implicit transaction a probe left open; a
    LISTEN on it is delivered at once.
    """
    kwargs = session.connect_kwargs()
    if application_name is not None:
        kwargs["application_name"] = application_name[:63]  # the server's NAMEDATALEN
    return LoginConnection.connect(
        dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, on_refused=on_refused, **kwargs
    )


class LazyConnection:
    """One connection, opened at first use and again once it is closed or broken.

    For a loop that holds a single session (a consumer's batches, a LISTEN, the relay's
    deletes): `prepare` runs on each new connection (a LISTEN, say) and a failure there
    closes it again; `discard()` after a failure drops it without raising, and the next
    `get()` reconnects.
    """

    def __init__(
        self,
        open_: Callable[[], Connection],
        *,
        prepare: Callable[[Connection], None] | None = None,
    ) -> None:
        self._open = open_
        self._prepare = prepare
        self._conn: Connection | None = None

    @property
    def current(self) -> Connection | None:
        """The connection held now, whatever its state (None: none opened since the last
        close)."""
        return self._conn

    @property
    def is_open(self) -> bool:
        """Whether `get()` would hand out the connection held now."""
        return self._conn is not None and _usable(self._conn)

    def get(self) -> Connection:
        conn = self._conn
        if conn is not None and _usable(conn):
            return conn
        self.discard()
        conn = self._open()
        if self._prepare is not None:
            try:
                self._prepare(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        return conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def discard(self) -> None:
        """Drop the connection after a failure, whatever state it is in."""
        try:
            self.close()
        except psycopg.Error:
            _log.debug("closing a failed connection failed", exc_info=True)


def create_pool(
    dsn: str,
    *,
    name: str,
    min_size: int = 1,
    max_size: int = 4,
    timeout: float = 30.0,
    application_name: str | None = None,
    connect_timeout: int = CONNECT_TIMEOUT,
    max_idle: float = 600.0,
    max_lifetime: float = 3600.0,
    reconnect_timeout: float = 300.0,
    configure: Callable[[psycopg.Connection[TupleRow]], None] | None = None,
    connect_kwargs: Mapping[str, Any] | None = None,
    session: SessionLimits | None = None,
    on_refused: OnRefused | None = None,
) -> Pool:
    """A closed pool: the caller opens it (`pool.open(wait=True, timeout=...)`) and closes it.

    Leaving it closed keeps construction free of I/O, so a service builds its world first and
    decides itself whether to wait for the database or start degraded.
    """
    if min_size < 0 or max_size < max(min_size, 1):
        raise ValueError(f"need 0 <= min_size <= max_size >= 1, got {min_size}, {max_size}")
    if timeout <= 0 or connect_timeout <= 0:
        raise ValueError("timeout and connect_timeout must be > 0")
    kwargs: dict[str, Any] = {
        "application_name": application_name or name,
        "connect_timeout": connect_timeout,
        **(session or SessionLimits()).connect_kwargs(),
        **(connect_kwargs or {}),
    }
    if on_refused is not None:
        kwargs["on_refused"] = on_refused  # taken by `LoginConnection.connect`, not libpq
    return ConnectionPool(
        dsn,
        # Each connection the pool opens reads the DSN's password file (if any) again.
        connection_class=LoginConnection,
        kwargs=kwargs,
        min_size=min_size,
        max_size=max_size,
        name=name,
        timeout=timeout,
        max_idle=max_idle,
        max_lifetime=max_lifetime,
        reconnect_timeout=reconnect_timeout,
        configure=configure,
        # A connection the server dropped while idle in the pool is replaced, not handed out.
        check=ConnectionPool.check_connection,
        open=False,
    )


def _usable(conn: Connection) -> bool:
    return not conn.closed and not conn.broken


def listen(conn: psycopg.Connection[Any], channel: str) -> None:
    """Subscribe an autocommit connection to `channel` (quoted as an identifier)."""
    conn.execute(_channels.compose("listen", channel=sql.Identifier(channel)))


def notify(conn: psycopg.Connection[Any], channel: str, payload: str = "") -> None:
    """Wake the listeners of `channel` when the caller's transaction commits."""
    conn.execute(_channels.notify, {"channel": channel, "payload": payload})
