from __future__ import annotations

import datetime
import decimal
import io
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider

from pin_runtime.logging import JsonFormatter, configure_logging, log_event


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(service="identity-fanout"))
    logger = logging.getLogger(f"test.{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in stream.getvalue().splitlines()]


def test_core_fields(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    logger.info("worker %s started", "w1")
    [line] = lines(stream)
    assert list(line)[:5] == ["ts", "level", "logger", "event", "service"]
    assert line["level"] == "INFO"
    assert line["logger"] == logger.name
    assert line["event"] == "worker w1 started"
    assert line["service"] == "identity-fanout"
    ts = datetime.datetime.fromisoformat(line["ts"])
    assert ts.utcoffset() == datetime.timedelta(0)
    assert line["ts"].endswith("Z")
    assert "trace_id" not in line


def test_log_event_keeps_field_names_and_encodes_rich_types(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    task = uuid.UUID(int=1)
    when = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    log_event(
        logger,
        "task dequeued",
        taskId=task,
        roleId=7,
        MessageId="m-1",
        at=when,
        amount=decimal.Decimal("1.10"),
        name="field named like a LogRecord attribute",
        logger="collides with a core key",
        obj=object,
    )
    [line] = lines(stream)
    assert line["event"] == "task dequeued"
    assert line["taskId"] == str(task)
    assert line["roleId"] == 7
    assert line["MessageId"] == "m-1"
    assert line["at"] == "2025-01-02T03:04:05Z"
    assert line["amount"] == 1.1
    assert line["name"] == "field named like a LogRecord attribute"
    assert line["logger"] == logger.name
    assert line["logger_"] == "collides with a core key"
    assert line["obj"] == "<class 'object'>"


def test_log_event_respects_level(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    logger.setLevel(logging.WARNING)
    log_event(logger, "quiet", x=1)
    log_event(logger, "loud", logging.ERROR, x=2)
    assert [(line["event"], line["level"]) for line in lines(stream)] == [("loud", "ERROR")]


def test_extra_fields(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    logger.warning("lease lost", extra={"taskId": "t1", "attempt": 3})
    [line] = lines(stream)
    assert (line["taskId"], line["attempt"]) == ("t1", 3)


def test_exception_as_string(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture

    def fail() -> None:
        raise RuntimeError("boom")

    try:
        fail()
    except RuntimeError:
        logger.exception("batch failed")
    [line] = lines(stream)
    assert line["level"] == "ERROR"
    assert "Traceback" in line["exception"]
    assert "RuntimeError: boom" in line["exception"]


def test_trace_ids_when_span_active(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        logger.info("inside")
    [line] = lines(stream)
    context = span.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


def test_the_events_own_trace_names_the_line(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    tracer = TracerProvider().get_tracer("test")
    produced = "4bf92f3577b34da6a3ce929d0e0e4736"
    with tracer.start_as_current_span("batch"):
        log_event(logger, "consumed", trace_id=produced)
        log_event(logger, "consumed", trace_id=None)  # the event has none: the span's
    log_event(logger, "consumed", trace_id=None)  # neither: named, empty
    events, untraced, none = lines(stream)
    assert (events["trace_id"], "span_id" in events) == (produced, False)
    assert untraced["trace_id"] not in (None, produced)
    assert "span_id" in untraced
    assert none["trace_id"] is None
    assert "trace_id_" not in events


def test_unencodable_fields_do_not_lose_the_line(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    cycle: list[object] = ["cycle"]
    cycle.append(cycle)
    log_event(logger, "odd", value=cycle)
    [line] = lines(stream)
    assert line["event"] == "odd"
    assert line["value"].startswith("['cycle'")
    assert "encode_error" in line


def test_configure_logging_replaces_root_handlers() -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()
    try:
        configure_logging("DEBUG", "rewards-membership", stream=stream)
        configure_logging("DEBUG", "rewards-membership", stream=stream)  # idempotent
        logging.getLogger("some.library").debug("hello")
        assert len(root.handlers) == 1
    finally:
        logging.captureWarnings(False)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)
    [line] = lines(stream)
    assert line["service"] == "rewards-membership"
    assert line["logger"] == "some.library"
