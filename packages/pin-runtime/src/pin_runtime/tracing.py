"""OpenTelemetry set-up from the standard `OTEL_*` variables, and trace context in Kafka headers.

Nothing is exported unless an operator asks for it: no endpoint and no `OTEL_TRACES_EXPORTER`
means spans are created (ids for the logs) but go nowhere, so a laptop run never tries to
reach a collector. The OTLP exporter speaks the protocol `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`
or `OTEL_EXPORTER_OTLP_PROTOCOL` names: grpc or http/protobuf (the specification's default).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Final
from urllib.parse import unquote

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Status
from opentelemetry.util.re import parse_env_headers
from opentelemetry.util.types import Attributes, AttributeValue

from pin_runtime.errors import SettingsError
from pin_runtime.settings import redact

__all__ = [
    "Headers",
    "RedactingExporter",
    "configure_tracing",
    "extract_context",
    "inject_headers",
    "shutdown_tracing",
]

# confluent-kafka's header shapes: produce() takes this list (values may be None for null
# headers); Message.headers() is typed as the list or a mapping.
Headers = list[tuple[str, str | bytes | None]]
ReadHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]

_EXPORTERS: Final = frozenset({"otlp", "console", "none"})
_HTTP_PROTOBUF: Final = "http/protobuf"
_GRPC: Final = "grpc"
# The signal's own variable first, then the one of every signal (the OTLP exporter
# specification's precedence); the same order for the endpoint, headers and insecure.
_PROTOCOL_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def configure_tracing(
    service_name: str,
    environ: Mapping[str, str] | None = None,
    *,
    version: str | None = None,
    set_global: bool = True,
) -> trace.TracerProvider:
    """Build the tracer provider the `OTEL_*` variables describe (and make it global).

    `version`: the resource's `service.version` unless OTEL_RESOURCE_ATTRIBUTES names one
    (where the chart also puts `deployment.environment.name`).

    Raises `SettingsError` for values this runtime cannot honour (an unknown exporter or
    protocol).
    """
    env = os.environ if environ is None else environ
    provider: trace.TracerProvider
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        provider = trace.NoOpTracerProvider()
    else:
        sdk = TracerProvider(resource=_resource(service_name, env, version))
        for name in _exporter_names(env):
            if name == "otlp":
                sdk.add_span_processor(BatchSpanProcessor(RedactingExporter(_otlp_exporter(env))))
            elif name == "console":
                # stderr: stdout carries one JSON log object per line and must stay parseable.
                console = ConsoleSpanExporter(out=sys.stderr)
                sdk.add_span_processor(SimpleSpanProcessor(RedactingExporter(console)))
        provider = sdk
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


class RedactingExporter(SpanExporter):
    """Exports spans with every configured secret scrubbed (`pin_runtime.settings.redact`).

    An exception recorded on a span carries its message, and a driver's message may quote a
    DSN; the collector, and whoever reads traces, must never see it.
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter

    @property
    def wrapped(self) -> SpanExporter:
        return self._exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._exporter.export([_redacted(span) for span in spans])

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


def _redacted(span: ReadableSpan) -> ReadableSpan:
    status = span.status
    if status.description:
        status = Status(status.status_code, redact(status.description))
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        kind=span.kind,
        # What may quote a driver's message: redacted.
        attributes=_redacted_attributes(span.attributes),
        status=status,
        events=[
            Event(e.name, _redacted_attributes(e.attributes), timestamp=e.timestamp)
            for e in span.events
        ],
        # The rest as recorded.
        links=span.links,
        resource=span.resource,
        instrumentation_scope=span.instrumentation_scope,
        start_time=span.start_time,
        end_time=span.end_time,
    )


def _redacted_attributes(attributes: Attributes) -> dict[str, AttributeValue]:
    return {
        key: redact(value) if isinstance(value, str) else value
        for key, value in (attributes or {}).items()
    }


def shutdown_tracing(provider: trace.TracerProvider, timeout_millis: int = 5000) -> None:
    """Flush pending spans and stop exporters (no-op for a disabled provider)."""
    if isinstance(provider, TracerProvider):
        provider.force_flush(timeout_millis)
        provider.shutdown()


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        has_endpoint = bool(
            env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        )
        return ["otlp"] if has_endpoint else []
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = sorted(set(names) - _EXPORTERS)
    if unknown:
        raise SettingsError(
            "OTEL_TRACES_EXPORTER", f"expected otlp, console or none, got {', '.join(unknown)}"
        )
    return [n for n in names if n != "none"]


def _otlp_protocol(env: Mapping[str, str]) -> str:
    """The OTLP protocol of the traces: the first of `_PROTOCOL_VARIABLES` that is set, else
    http/protobuf. Another value is a `SettingsError` naming its variable."""
    for variable in _PROTOCOL_VARIABLES:
        protocol = env.get(variable, "").strip()
        if not protocol:
            continue
        if protocol not in {_GRPC, _HTTP_PROTOBUF}:
            raise SettingsError(variable, f"expected grpc or http/protobuf, got {protocol!r}")
        return protocol
    return _HTTP_PROTOBUF


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    # Every value from `env`, none left for the exporter to read from os.environ itself, so a
    # passed mapping is the whole configuration.
    headers = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS")
    parsed = dict(parse_env_headers(headers, liberal=True)) if headers else None
    signal_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if _otlp_protocol(env) == _GRPC:
        # gRPC has no path: either endpoint is the collector's address as it is. Its scheme
        # says TLS or not (https: TLS); without one, OTEL_EXPORTER_OTLP_[TRACES_]INSECURE.
        endpoint = signal_endpoint or base or "http://localhost:4317"
        return GrpcSpanExporter(
            endpoint=endpoint, insecure=_insecure(env, endpoint), headers=parsed
        )
    endpoint = signal_endpoint
    if not endpoint:
        # The signal-less endpoint is a base URL; the traces path is appended (OTLP spec).
        endpoint = (base or "http://localhost:4318").rstrip("/") + "/v1/traces"
    return HttpSpanExporter(endpoint=endpoint, headers=parsed)


def _insecure(env: Mapping[str, str], endpoint: str) -> bool:
    scheme = endpoint.partition("://")[0].lower() if "://" in endpoint else ""
    if scheme in {"http", "https"}:
        return scheme == "http"
    flag = env.get("OTEL_EXPORTER_OTLP_TRACES_INSECURE") or env.get("OTEL_EXPORTER_OTLP_INSECURE")
    return (flag or "").strip().lower() == "true"


def _resource(service_name: str, env: Mapping[str, str], version: str | None) -> Resource:
    # Resource.create reads os.environ itself; the attributes are parsed from `env` too so a
    # passed mapping wins, with the spec's precedence: OTEL_SERVICE_NAME over
    # OTEL_RESOURCE_ATTRIBUTES' service.name over the code's default.
    attributes: dict[str, str] = {SERVICE_NAME: service_name}
    if version:
        attributes[SERVICE_VERSION] = version
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    if env.get("OTEL_SERVICE_NAME", "").strip():
        attributes[SERVICE_NAME] = env["OTEL_SERVICE_NAME"].strip()
    return Resource.create(attributes)


class _HeaderSetter(Setter[Headers]):
    def set(self, carrier: Headers, key: str, value: str) -> None:
        carrier.append((key, value.encode()))


class _HeaderGetter(Getter[ReadHeaders]):
    def get(self, carrier: ReadHeaders, key: str) -> list[str] | None:
        wanted = key.lower()
        values = [_text(v) for k, v in _pairs(carrier) if k.lower() == wanted and v is not None]
        return values or None

    def keys(self, carrier: ReadHeaders) -> list[str]:
        return [k for k, _ in _pairs(carrier)]


def _pairs(carrier: ReadHeaders) -> Iterable[tuple[str, str | bytes | None]]:
    return carrier.items() if isinstance(carrier, Mapping) else carrier


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


_SETTER: Final = _HeaderSetter()
_GETTER: Final = _HeaderGetter()


def inject_headers(headers: Headers, context: Context | None = None) -> None:
    """Write W3C `traceparent`/`tracestate` (and baggage) of `context` into `headers`.

    Old propagation headers are dropped first: a message republished with its original
    headers (DLQ) must carry one `traceparent`, the current one.
    """
    fields = {f.lower() for f in propagate.get_global_textmap().fields}
    headers[:] = [(k, v) for k, v in headers if k.lower() not in fields]
    propagate.inject(headers, context=context, setter=_SETTER)


def extract_context(headers: ReadHeaders | None, context: Context | None = None) -> Context:
    """The trace context carried by a consumed message's headers (empty when absent)."""
    return propagate.extract(headers or [], context=context, getter=_GETTER)
