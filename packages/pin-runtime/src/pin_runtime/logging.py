"""JSON lines on stdout for the stdlib `logging` module.

One object per line: `ts`, `level`, `logger`, `event`, `service`, then `trace_id`/`span_id`
when a span is active (a caller's own `trace_id`, the trace of the event a line is about,
takes its place), the caller's fields under the names given (`taskId`, `MessageId`),
and `exception`. Field names are the specs' names, so nothing renames them.
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any, Final, Literal

import msgspec
from opentelemetry import trace

from pin_runtime.settings import redact

__all__ = [
    "FIELDS_ATTRIBUTE",
    "JsonFormatter",
    "LogLevel",
    "configure_logging",
    "log_event",
]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]

# `log_event` puts its fields under one attribute so any name (even `name` or `msg`, which
# `extra=` rejects) survives.
FIELDS_ATTRIBUTE: Final = "pin_fields"

_CORE: Final = frozenset(
    {"ts", "level", "logger", "event", "service", "trace_id", "span_id", "exception", "stack"}
)
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName", FIELDS_ATTRIBUTE}
)


def _enc_hook(value: object) -> object:
    # A log line must never fail because of a field's type: fall back to its str().
    return str(value)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (msgspec encodes UUID, datetime, Decimal natively)."""

    def __init__(self, *, service: str | None = None) -> None:
        super().__init__()
        self._service = service
        self._encoder = msgspec.json.Encoder(enc_hook=_enc_hook, decimal_format="number")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        if self._service is not None:
            out["service"] = self._service
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            out["trace_id"] = format(context.trace_id, "032x")
            out["span_id"] = format(context.span_id, "016x")
        for key, value in _fields(record):
            if key == "trace_id" and value is not None and value != out.get("trace_id"):
                # The trace of the event the line is about (a consumed record's producer
                # trace) names it better than whatever span the logging thread is in.
                out["trace_id"] = value
                out.pop("span_id", None)
            elif key == "trace_id":
                out.setdefault("trace_id", None)
            else:
                # A caller's field never overwrites a core key; it is kept, suffixed.
                out[f"{key}_" if key in _CORE else key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        try:
            line = self._encoder.encode(out).decode()
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            out = {k: v if k in _CORE else repr(v) for k, v in out.items()}
            out["encode_error"] = str(exc)
            line = self._encoder.encode(out).decode()
        return redact(line)


def _fields(record: logging.LogRecord) -> list[tuple[str, Any]]:
    items = [(k, v) for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES]
    extra = getattr(record, FIELDS_ATTRIBUTE, None)
    if isinstance(extra, Mapping):
        items.extend(extra.items())
    return items


def log_event(
    logger: logging.Logger, event: str, /, level: int = logging.INFO, **fields: Any
) -> None:
    """Log `event` with structured fields: `log_event(log, "task dequeued", taskId=t)`."""
    if logger.isEnabledFor(level):
        # stacklevel=2: the line reported is the caller's, not this helper's.
        logger.log(level, event, extra={FIELDS_ATTRIBUTE: fields}, stacklevel=2)


def configure_logging(
    level: LogLevel | int = "INFO",
    service: str | None = None,
    *,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Send every logger's records as JSON lines to stdout (or `stream`); idempotent."""
    handler = logging.StreamHandler(sys.stdout if stream is None else stream)
    handler.setFormatter(JsonFormatter(service=service))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    # An exception nobody caught would otherwise reach stderr through Python's own hook,
    # unredacted: it goes through the log as one JSON line instead.
    sys.excepthook = _log_unhandled
    return handler


def _log_unhandled(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger(__name__).critical("unhandled exception", exc_info=(kind, value, tb))
