"""Record key and headers of PIN event records. Pure: no Kafka client involved.

Headers are a convenience for routing and tracing without parsing the value; the value
is authoritative wherever the two disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from pin_contracts.envelope import Envelope, EventPayload

__all__ = [
    "CONTRACT_VERSION_HEADER",
    "EVENT_TYPE_HEADER",
    "MESSAGE_ID_HEADER",
    "TRACEPARENT_HEADER",
    "TRACESTATE_HEADER",
    "Headers",
    "ReceivedHeaders",
    "header_text",
    "headers_for",
    "kafka_key",
    "trace_context",
    "trace_headers",
]

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
EVENT_TYPE_HEADER = "pin-event-type"
CONTRACT_VERSION_HEADER = "pin-contract-version"
MESSAGE_ID_HEADER = "pin-message-id"

Headers = list[tuple[str, str | bytes | None]]
"""Headers as confluent-kafka's ``produce(headers=...)`` takes them (this module writes bytes)."""

ReceivedHeaders = Sequence[tuple[str, str | bytes | None]] | None
"""Headers as confluent-kafka's ``Message.headers()`` returns them."""

P = TypeVar("P", bound=EventPayload)


def kafka_key(source: Envelope[P] | P) -> bytes:
    """The record key: the payload's key field as a canonical lowercase hyphenated UUID."""
    payload = source.payload if isinstance(source, Envelope) else source
    return str(payload.record_key).encode()


def headers_for(
    envelope: Envelope[P], *, trace_context: Mapping[str, str] | None = None
) -> Headers:
    """Headers of the record carrying ``envelope``.

    ``trace_context`` is the carrier an OpenTelemetry propagator injected into; only the
    W3C keys are copied, and ``tracestate`` only together with a ``traceparent``.
    """
    headers: Headers = [
        (EVENT_TYPE_HEADER, envelope.event_type.encode()),
        (CONTRACT_VERSION_HEADER, str(envelope.contract_version).encode()),
        (MESSAGE_ID_HEADER, str(envelope.message_id).encode()),
    ]
    headers.extend(trace_headers(trace_context))
    return headers


def trace_headers(trace_context: Mapping[str, str] | None) -> Headers:
    """The trace headers ``headers_for`` appends: the W3C keys of the carrier, and
    ``tracestate`` only together with a ``traceparent``.

    Apart so a producer that writes the other headers itself (a batch built in SQL) adds
    the same trace headers by the same rule.
    """
    headers: Headers = []
    if trace_context is not None:
        traceparent = trace_context.get(TRACEPARENT_HEADER)
        if traceparent:
            headers.append((TRACEPARENT_HEADER, traceparent.encode()))
            tracestate = trace_context.get(TRACESTATE_HEADER)
            if tracestate:
                headers.append((TRACESTATE_HEADER, tracestate.encode()))
    return headers


def header_text(headers: ReceivedHeaders, name: str) -> str | None:
    """The last value of header ``name`` as text; None when absent, null or not UTF-8."""
    for key, value in reversed(headers or ()):
        if key == name:
            if value is None or isinstance(value, str):
                return value
            try:
                return value.decode()
            except UnicodeDecodeError:
                return None
    return None


def trace_context(headers: ReceivedHeaders) -> dict[str, str]:
    """The W3C trace headers of a received record, as a carrier for a propagator's extract."""
    carrier: dict[str, str] = {}
    for name in (TRACEPARENT_HEADER, TRACESTATE_HEADER):
        value = header_text(headers, name)
        if value is not None:
            carrier[name] = value
    return carrier
