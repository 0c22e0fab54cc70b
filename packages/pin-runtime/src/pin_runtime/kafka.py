"""confluent-kafka clients with the delivery guarantees both workers rely on.

Config is built by pure functions (`producer_config`, `consumer_config`, `admin_config`) so
tests can read it; `create_*` add the logging callbacks and construct the client. The
authentication settings and `verify_connection` live in `pin_runtime.kafka_security` and are
re-exported here. A consumed record's headers are read through `read_headers` /
`record_headers` only, which never raise whatever bytes the record carries.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypedDict, Unpack

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from pin_runtime.errors import KafkaSetupError
from pin_runtime.kafka_security import verify_connection
from pin_runtime.kafka_settings import (
    ConfigValue,
    KafkaClientSettings,
    KafkaConfig,
    SaslMechanism,
    SecurityProtocol,
    librdkafka_config,
    renewed_sasl_password,
    security_config,
)
from pin_runtime.logging import log_event
from pin_runtime.secret_files import SecretFileError

__all__ = [
    "METADATA_REFRESH_MS",
    "ConfigValue",
    "HeadersRead",
    "KafkaClientSettings",
    "KafkaConfig",
    "LoginRenewal",
    "RecordHeaders",
    "SaslMechanism",
    "SecurityProtocol",
    "TopicSpec",
    "admin_config",
    "consumer_config",
    "create_admin",
    "create_consumer",
    "create_producer",
    "ensure_topics",
    "producer_config",
    "read_headers",
    "record_headers",
    "refused_login",
    "renewed_sasl_password",
    "report_refused_login",
    "security_config",
    "verify_connection",
]

ErrorCallback = Callable[[KafkaError], None]
Compression = Literal["lz4", "zstd", "snappy", "gzip", "none"]

_log = logging.getLogger(__name__)
# librdkafka's own log lines arrive here (served by poll/flush), under a separate name so an
# operator can raise their level alone.
_librdkafka_log = logging.getLogger("pin_runtime.kafka.librdkafka")

# The broker (librdkafka) refuses idempotence with more than 5 requests in flight.
MAX_IN_FLIGHT_WITH_IDEMPOTENCE: Final = 5
METADATA_REFRESH_MS: Final = 10_000
"""librdkafka's `topic.metadata.refresh.interval.ms` for producers and consumers (its
default: 300 s). Partitions added to a topic are seen within it: a consumer fetches a new
partition's records at most this long (plus a rebalance) after they arrived, where the
default left them waiting for minutes with no gauge moving."""


def _base(bootstrap: str, client_id: str) -> KafkaConfig:
    if not bootstrap.strip():
        raise ValueError("bootstrap servers must not be empty")
    if not client_id.strip():
        raise ValueError("client_id must not be empty")
    return {"bootstrap.servers": bootstrap, "client.id": client_id}


def producer_config(
    bootstrap: str,
    *,
    client_id: str,
    linger_ms: int = 10,
    compression: Compression = "lz4",
    extra: Mapping[str, ConfigValue] | None = None,
) -> KafkaConfig:
    """Idempotent, acks=all producer config: no duplicates, no reordering per partition."""
    config = _base(bootstrap, client_id) | {
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": MAX_IN_FLIGHT_WITH_IDEMPOTENCE,
        # A few ms of batching multiplies throughput of the relay at negligible latency.
        "linger.ms": linger_ms,
        # lz4: cheapest CPU per byte saved; every broker since 0.10 reads it.
        "compression.type": compression,
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
    }
    config.update(extra or {})
    in_flight = config["max.in.flight.requests.per.connection"]
    if config["enable.idempotence"] is True and (
        not isinstance(in_flight, int) or in_flight > MAX_IN_FLIGHT_WITH_IDEMPOTENCE
    ):
        raise ValueError(
            "max.in.flight.requests.per.connection must be an int <= 5 with idempotence"
        )
    return config


def consumer_config(
    bootstrap: str,
    *,
    group_id: str,
    client_id: str,
    extra: Mapping[str, ConfigValue] | None = None,
) -> KafkaConfig:
    """Consumer config for "commit after the DB transaction": nothing is committed for you."""
    if not group_id.strip():
        raise ValueError("group_id must not be empty")
    config = _base(bootstrap, client_id) | {
        "group.id": group_id,
        "enable.auto.commit": False,
        # Offsets are stored by the service only for messages it finished with.
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Incremental rebalances: other partitions keep flowing while one moves.
        "partition.assignment.strategy": "cooperative-sticky",
        # The identity relay's writes are visible only once the broker committed them.
        "isolation.level": "read_committed",
        # New partitions of a subscribed topic are assigned within this (not 5 minutes).
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
    }
    config.update(extra or {})
    return config


def admin_config(
    bootstrap: str, *, client_id: str, extra: Mapping[str, ConfigValue] | None = None
) -> KafkaConfig:
    return _base(bootstrap, client_id) | dict(extra or {})


ERROR_LOG_INTERVAL: Final = 30.0
"""Seconds during which a client logs a repeated error (same client, same code) or a repeated
librdkafka line (same client, same facility) once: an outage of Kafka made librdkafka report
the same failure several times a second per client (31,000 lines from 4 processes in a 213 s
outage, 8,300 in 2 s from one client on recovery)."""


class RepeatLimiter:
    """Whether a line of `key` is logged now: the first one, then one per `interval` while
    it repeats, carrying how many were left out since the last one."""

    def __init__(
        self, interval: float = ERROR_LOG_INTERVAL, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._left_out: dict[tuple[str, str], int] = {}

    def admit(self, key: tuple[str, str]) -> int | None:
        """None: leave this line out; else log it, with the number left out before it."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._left_out[key] = self._left_out.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._left_out.pop(key, 0)


_repeats = RepeatLimiter()

# librdkafka logs a failure it also gives error_cb (a broker connection refused or lost: the
# facilities FAIL and ERROR): error_cb's line, `kafka client error`, is the one kept.
_REPORTED_BY_ERROR_CB: Final = frozenset({"FAIL", "ERROR"})


class _LibrdkafkaLines(logging.Filter):
    """librdkafka's own lines (confluent_kafka logs `"%s [%s] %s"`: facility, client, text):
    none that error_cb reports too, and one per facility and client per ERROR_LOG_INTERVAL."""

    def __init__(self, limiter: RepeatLimiter) -> None:
        super().__init__()
        self._limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 2:  # noqa: PLR2004 - (facility, client, …)
            return True
        facility, client = str(args[0]), str(args[1])
        if facility in _REPORTED_BY_ERROR_CB:
            return False
        left_out = self._limiter.admit((client, f"log:{facility}"))
        if left_out is None:
            return False
        if left_out:
            record.msg = f"{record.msg} (and {left_out} more like it)"
        return True


_librdkafka_log.addFilter(_LibrdkafkaLines(_repeats))


def _error_callback(
    client_id: str, on_error: ErrorCallback | None, *, limiter: RepeatLimiter | None = None
) -> ErrorCallback:
    repeats = limiter or _repeats

    def callback(error: KafkaError) -> None:
        # Most errors (broker down, all brokers down) are transient: librdkafka retries.
        # Fatal ones (idempotent producer fenced, etc.) need a new client: always logged.
        left_out = 0 if error.fatal() else repeats.admit((client_id, error.name()))
        if left_out is not None:
            level = logging.ERROR if error.fatal() else logging.WARNING
            fields: dict[str, object] = {"repeated": left_out} if left_out else {}
            log_event(
                _log,
                "kafka client error",
                level,
                client_id=client_id,
                code=error.name(),
                reason=error.str(),
                fatal=error.fatal(),
                retriable=error.retriable(),
                **fields,
            )
        # The caller's state (readiness, a login renewal) sees every error, logged or not.
        if on_error is not None:
            on_error(error)

    return callback


def refused_login(error: KafkaError) -> bool:
    """Whether the brokers refused the client's credentials (a wrong or rotated SASL
    password): librdkafka retries the same password without end, so the client's owner
    asks `renewed_sasl_password` whether its file holds another one to rebuild with."""
    return error.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)


def report_refused_login(
    error: KafkaError,
    config: Mapping[str, ConfigValue],
    count: Callable[[], object],
    *,
    log: logging.Logger = _log,
) -> bool:
    """`kafka authentication failed` (ERROR: the SASL user and mechanism of `config`, the
    error librdkafka reported; never the password), counted by `count`, when `error` is the
    brokers refusing the login (`refused_login`); False, nothing logged, for anything else.

    librdkafka reports a refusal once each time it tries the login again, so the count
    grows while the refusal lasts and an alert on its increase clears once it stops. `log`:
    the caller's logger."""
    if not refused_login(error):
        return False
    count()
    log_event(
        log,
        "kafka authentication failed",
        logging.ERROR,
        user=str(config.get("sasl.username", "")),
        mechanism=str(config.get("sasl.mechanism", "")),
        code=error.name(),
        error=error.str(),
    )
    return True


RENEWAL_INTERVAL: Final = 1.0
"""Seconds between two reads of a SASL password file while the brokers refuse the login."""


class LoginRenewal:
    """Whether clients built from `config` are to be built again with a rotated password.

    Their error callbacks report to `refused`; their owner asks `due()` in its loop: True
    once their login was refused and the SASL password file (`SASL_PASSWORD_FILE`) holds a
    password other than the one they were built with. The file is read at most every
    `interval` seconds, and only after a refusal: librdkafka reports a refusal it repeats
    once, and a Secret volume shows a rotated Secret a minute or two after the brokers."""

    def __init__(
        self,
        config: Mapping[str, ConfigValue],
        *,
        interval: float = RENEWAL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = dict(config)
        self._interval = interval
        self._clock = clock
        self._refused = False
        self._next_look = 0.0

    def refused(self, error: KafkaError) -> None:
        """An error callback: notes a refused login (`refused_login`), ignores the rest."""
        if refused_login(error):
            self._refused = True

    def due(self) -> bool:
        """Whether the file holds a new password since a refusal (read it again if so)."""
        return self.renewed() is not None

    def renewed(self) -> KafkaConfig | None:
        """`due()`, as the config to build the clients again with (None: not due)."""
        now = self._clock()
        if not self._refused or now < self._next_look:
            return None
        self._next_look = now + self._interval
        try:
            return renewed_sasl_password(self._config)
        except SecretFileError as exc:
            log_event(_log, "kafka sasl password file unreadable", logging.WARNING, reason=str(exc))
            return None


class ProducerOptions(TypedDict, total=False):
    """The optional settings of `producer_config`, passed through by `create_producer`."""

    linger_ms: int
    compression: Compression
    extra: Mapping[str, ConfigValue] | None


def create_producer(
    bootstrap: str,
    *,
    client_id: str,
    on_error: ErrorCallback | None = None,
    **options: Unpack[ProducerOptions],
) -> Producer:
    config = producer_config(bootstrap, client_id=client_id, **options)
    return Producer(
        {
            **librdkafka_config(config),
            "error_cb": _error_callback(client_id, on_error),
            "logger": _librdkafka_log,
        }
    )


def create_consumer(
    bootstrap: str,
    *,
    group_id: str,
    client_id: str,
    extra: Mapping[str, ConfigValue] | None = None,
    on_error: ErrorCallback | None = None,
) -> Consumer:
    config = consumer_config(bootstrap, group_id=group_id, client_id=client_id, extra=extra)
    return Consumer(
        {
            **librdkafka_config(config),
            "error_cb": _error_callback(client_id, on_error),
            "logger": _librdkafka_log,
        }
    )


def create_admin(
    bootstrap: str,
    *,
    client_id: str,
    extra: Mapping[str, ConfigValue] | None = None,
    on_error: ErrorCallback | None = None,
) -> AdminClient:
    # The stubs type admin config values as scalars; librdkafka's logger hook is accepted too.
    config: dict[str, Any] = {
        **librdkafka_config(admin_config(bootstrap, client_id=client_id, extra=extra)),
        "logger": _librdkafka_log,
    }
    if on_error is not None:
        config["error_cb"] = _error_callback(client_id, on_error)
    return AdminClient(config)


TopicSpec = tuple[str, int] | tuple[str, int, Mapping[str, str]]
"""(name, partitions) or (name, partitions, topic config such as max.message.bytes)."""


def ensure_topics(
    admin: AdminClient,
    topics: Sequence[TopicSpec],
    *,
    replication_factor: int = 1,
    topic_config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> list[str]:
    """Create the missing topics and wait until every partition has a leader.

    Returns the names created here. An existing topic is left as it is (an operator may
    have grown it), with a warning when it has fewer partitions than asked.
    """
    deadline = time.monotonic() + timeout
    wanted = {spec[0]: spec[1] for spec in topics}
    configs = {spec[0]: dict(spec[2]) if len(spec) == 3 else {} for spec in topics}  # noqa: PLR2004
    existing = admin.list_topics(timeout=timeout).topics
    for name, partitions in wanted.items():
        if name in existing and len(existing[name].partitions) < partitions:
            log_event(
                _log,
                "kafka topic has fewer partitions than configured",
                logging.WARNING,
                topic=name,
                partitions=len(existing[name].partitions),
                expected=partitions,
            )
    missing = [
        NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config={**(topic_config or {}), **configs[name]},
        )
        for name, partitions in wanted.items()
        if name not in existing
    ]
    created: list[str] = []
    if missing:
        futures = admin.create_topics(missing, operation_timeout=timeout, request_timeout=timeout)
        for name, future in futures.items():
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except KafkaException as exc:
                error = exc.args[0]
                # Another process created it between our look and our create: that is fine.
                if not (
                    isinstance(error, KafkaError)
                    and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
                ):
                    raise KafkaSetupError(f"creating topic {name!r} failed: {exc}") from exc
            else:
                created.append(name)
                log_event(_log, "kafka topic created", topic=name, partitions=wanted[name])
    _await_leaders(admin, wanted, deadline)
    return created


def _await_leaders(admin: AdminClient, wanted: Mapping[str, int], deadline: float) -> None:
    # CreateTopics returns before every broker's metadata knows the topic; producing then
    # fails with UNKNOWN_TOPIC_OR_PART. Poll metadata (bounded) until all partitions lead.
    pending = dict(wanted)
    while True:
        remaining = deadline - time.monotonic()
        metadata = admin.list_topics(timeout=max(remaining, 0.5)).topics
        for name in list(pending):
            topic = metadata.get(name)
            if (
                topic is not None
                and topic.error is None
                and topic.partitions
                and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
            ):
                del pending[name]
        if not pending:
            return
        if remaining <= 0:
            raise KafkaSetupError(f"topics without partition leaders in time: {sorted(pending)}")
        time.sleep(min(0.1, remaining))  # metadata has no change notification to wait on


RecordHeaders = list[tuple[str, str | bytes | None]]
"""A consumed record's headers in order, as confluent-kafka gives them (values are bytes, or
None for a null header), as `produce(headers=...)` takes them back."""


HeadersRead = tuple[RecordHeaders, str | None]
"""What `read_headers` could read of a record's headers: every header in order (empty when
it has none or they are unreadable), and why the client could not read them, or None. A
plain tuple: it is built for every record consumed."""


class _Unreadable(list[tuple[str, str | bytes | None]]):
    """No headers, in place of a list the client could not build, and why."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


_headers: Final = functools.partial(Message.headers)
"""`Message.headers`, called through the interpreter's vectorcall, which turns a result
returned with an exception set into a `SystemError` every time. A plain
`message.headers()` does not: once the interpreter has specialised the call, it takes the
result as it comes, the exception stays pending and is raised by whatever code runs next
(or the half-built list is read, and the process dies)."""


def read_headers(message: Message) -> HeadersRead:
    """The headers of a consumed record and None, whatever bytes it carries, or no headers
    and why the client could not read them: never raises.

    Header names are bytes on the wire, but confluent-kafka decodes them as UTF-8 in C.
    On a name that is not UTF-8 (2.16) `Message.headers()` returns a half-built list with
    the `UnicodeDecodeError` set, which surfaces as a `SystemError` or later, elsewhere,
    and keeps that list: the next call returns it, and reading it crashes the interpreter
    (a null item), as do `==` and pickling of the message. Any producer can write such a
    name, so every reader of records in this project asks for the headers here, before
    anything else does: the failed list is replaced at once (`set_headers`) by an empty
    one that remembers why, so every later reader finds no headers and the reason, and the
    message is safe to use again. The client builds the list whole or not at all: none of
    such a record's headers can be kept (what stays of it is its key, value and
    position)."""
    try:
        raw = _headers(message)
    except Exception as exc:  # whatever the client raises: these are bytes nobody vouches for
        cause = exc.__cause__ or exc.__context__ or exc
        unreadable = _Unreadable(f"{type(cause).__name__}: {cause}")
        message.set_headers(unreadable)
        return [], unreadable.reason
    if type(raw) is list:  # the usual case first: this runs for every record consumed
        # A copy: the client hands out the same list at every call.
        return raw.copy(), None
    if raw is None:
        return [], None
    if isinstance(raw, _Unreadable):
        return [], raw.reason
    if isinstance(raw, dict):
        return list(raw.items()), None
    return list(raw), None


def record_headers(message: Message) -> RecordHeaders:
    """A record's headers (`read_headers`), none when they cannot be read."""
    return read_headers(message)[0]
