"""Secrets a process was configured with never leave it in a log line, a span or an error."""

from __future__ import annotations

import io
import json
import logging
import uuid

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pin_runtime.logging import JsonFormatter
from pin_runtime.settings import (
    Secret,
    parse_duration,
    redact,
    scrub,
    secrets_forgotten_after,
)
from pin_runtime.tracing import RedactingExporter


def _password() -> str:
    return f"pw-{uuid.uuid4().hex}"


def test_a_dsn_secret_and_its_password_are_redacted_in_any_text() -> None:
    password = _password()
    dsn = f"postgresql://svc:{password}@db:5432/pin_identity"
    Secret(dsn)
    assert redact(f"cannot connect with {dsn}") == "cannot connect with ***"
    # A driver that quotes only part of the DSN still quotes the password.
    assert password not in redact(f"invalid option //svc:{password}@db")
    keyword = _password()
    Secret(f"host=db user=svc password='{keyword}' dbname=x")
    assert keyword not in redact(f"password={keyword} was refused")


def test_secrets_registered_inside_a_scope_are_forgotten_after_it() -> None:
    kept = _password()
    Secret(kept)
    with secrets_forgotten_after():
        Secret("BATCH")  # a drawn "password" that is also a variable's name
        assert redact("BATCH and " + kept) == "*** and ***"
    assert redact("BATCH and " + kept) == "BATCH and ***"


def test_a_secret_is_scrubbed_as_a_whole_token_only() -> None:
    def scrubbed(text: str) -> str:
        return scrub(text, ["pin-runtime"])

    # Wherever a DSN, a URL, a keyword DSN or a message puts it: gone.
    assert scrubbed("postgresql://u:pin-runtime@h/db") == "postgresql://u:***@h/db"
    assert scrubbed("host=h password=pin-runtime dbname=x") == "host=h password=*** dbname=x"
    assert scrubbed("https://h/x?password=pin-runtime&a=1") == "https://h/x?password=***&a=1"
    assert scrubbed("refused 'pin-runtime'.") == "refused '***'."
    assert scrubbed("login with pin-runtime.") == "login with ***."
    assert scrubbed('{"password":"pin-runtime"}') == '{"password":"***"}'
    assert scrubbed("pin-runtime") == "***"
    # In a JSON line, after a line break or a tab (escaped `\n`, `\t`): still the secret.
    assert scrubbed(json.dumps("boom\npin-runtime\tx")) == json.dumps("boom\n***\tx")
    # Inside a path or a longer name it is not the secret: a traceback stays readable.
    path = 'File "/work/packages/pin-runtime/src/pin_runtime/postgres.py", line 3'
    assert scrubbed(path) == path
    for text in ("pin-runtime-horizon", "xpin-runtime", "pin-runtime_2", "pin-runtime.log"):
        assert scrubbed(text) == text


def test_redact_scrubs_the_processs_secrets_as_whole_tokens() -> None:
    tag = uuid.uuid4().hex  # words no other test registered as a secret
    with secrets_forgotten_after():
        Secret("pin-runtime")
        assert redact(f"u{tag}:pin-runtime@h{tag}") == f"u{tag}:***@h{tag}"
        path = f"/w{tag}/packages/pin-runtime/src/pin_runtime"
        assert redact(path) == path


def test_a_traceback_through_the_runtime_keeps_its_paths_when_a_password_names_it() -> None:
    with secrets_forgotten_after():
        Secret("pin-runtime")
        with pytest.raises(ValueError, match="not a duration") as raised:
            parse_duration("soon")  # raised inside packages/pin-runtime/src/...
        exc = raised.value
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "bad", (), None)
        record.exc_info = (type(exc), exc, exc.__traceback__)
        line = json.loads(JsonFormatter().format(record))
    assert "packages/pin-runtime/src/pin_runtime/settings.py" in line["exception"]


def test_a_kafka_setup_error_scrubs_its_secrets_as_whole_tokens() -> None:
    from pin_runtime.kafka_security import _scrub  # noqa: PLC0415 - the one helper under test

    line = "sasl.password=pin-runtime refused\nat /opt/pin-runtime/lib"
    assert _scrub(line, ["pin-runtime"]) == "sasl.password=*** refused at /opt/pin-runtime/lib"


def test_short_values_are_left_alone() -> None:
    Secret("ab")
    assert redact("tab and cab") == "tab and cab"


def test_a_malformed_dsn_quoted_by_psycopg_is_redacted_in_the_log_line() -> None:
    password = _password()
    # A DSN with a typo: libpq reports the unknown option, password and all.
    dsn = f"host=127.0.0.1 port=1 //svc:{password}@oops"
    Secret(dsn)
    with pytest.raises(psycopg.ProgrammingError) as raised:
        psycopg.connect(dsn, connect_timeout=1)
    assert password in str(raised.value)  # what a service would otherwise log
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(service="svc"))
    log = logging.getLogger(f"redaction-{uuid.uuid4().hex}")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("connect failed: %s", raised.value, exc_info=raised.value)
    finally:
        log.removeHandler(handler)
    line = stream.getvalue()
    assert password not in line
    assert "***" in json.loads(line)["event"]


def test_a_password_with_json_escapes_is_redacted_in_the_encoded_line() -> None:
    password = f'p"w\\{uuid.uuid4().hex}'
    Secret(password)
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "login %s", (password,), None)
    line = JsonFormatter().format(record)
    assert uuid.UUID(password[-32:]).hex not in line
    assert json.loads(line)["event"] == "login ***"


def test_spans_are_exported_with_secrets_scrubbed() -> None:
    password = _password()
    Secret(password)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(RedactingExporter(memory)))
    tracer = provider.get_tracer("test")
    with pytest.raises(RuntimeError):  # noqa: SIM117 - the span records what escapes it
        with tracer.start_as_current_span("apply", attributes={"db.query.text": password}):
            raise RuntimeError(f"login with {password} refused")
    [exported] = memory.get_finished_spans()
    assert exported.attributes is not None
    assert exported.attributes["db.query.text"] == "***"
    texts = [str(v) for e in exported.events for v in (e.attributes or {}).values()]
    assert texts
    assert all(password not in text for text in texts)
    assert exported.status.description is not None
    assert password not in exported.status.description
    provider.shutdown()
