"""Whether a Kafka client can authenticate: a fail-fast check at start-up.

`KafkaClientSettings` and `security_config` live in `kafka_settings`, which loads no Kafka
client library. `verify_connection` turns "the client can never authenticate" from an
endless retry loop in librdkafka's background threads into one clear error at start-up.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pin_runtime.errors import KafkaSetupError, KafkaUnreachableError
from pin_runtime.kafka_settings import ConfigValue, KafkaClientSettings, librdkafka_config
from pin_runtime.logging import log_event
from pin_runtime.settings import CONFIG_ERROR_EXIT_CODE, scrub

__all__ = ["kafka_or_exit", "verify_connection"]

_SECRET_KEYS: Final = ("sasl.password", "ssl.key.password")
# How librdkafka words TLS failures it reports as transport errors: a handshake it refused,
# or (TLS 1.3) the broker's alert after the handshake, e.g. for a missing client certificate.
_TLS_MARKS: Final = ("SSL handshake failed", "ssl/tls alert", "SSL routines")
_PROBE_SLICE: Final = 0.5  # seconds per metadata attempt, so error callbacks are seen promptly
_log = logging.getLogger(__name__)
_verify_log = logging.getLogger("pin_runtime.kafka.librdkafka")


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
        **librdkafka_config(config),
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
    return scrub(text, sorted(secrets, key=len, reverse=True)).replace("\n", " ")


def kafka_or_exit(
    settings: KafkaClientSettings, prefix: str, *, command: str, timeout: float = 15.0
) -> None:
    """The start of every command that talks to Kafka: bootstrap set, credentials accepted.

    A missing bootstrap, a TLS file that is not there, or credentials or TLS settings the
    brokers refuse: one line on
    stderr and exit 2, as for any bad setting (retrying cannot fix either, and a crash loop
    with a clear line beats a pod that looks healthy and never consumes). No broker answering
    is an outage, not a mistake: logged, and the command's loop waits it out with backoff.
    """
    if not settings.kafka_bootstrap.strip():
        _exit_with(f"config error: {prefix}KAFKA_BOOTSTRAP: required by `{command}`")
    refused = settings.unreadable_sasl_password_file()
    if refused is not None:
        _exit_with(f"config error: {prefix}KAFKA_SASL_PASSWORD_FILE: {refused}")
    unreadable = settings.unreadable_tls_file()
    if unreadable is not None:
        path = getattr(settings, unreadable)
        _exit_with(f"config error: {prefix}{unreadable.upper()}: no readable file at {path!r}")
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
