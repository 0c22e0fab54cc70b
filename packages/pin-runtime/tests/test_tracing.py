from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc  # type: ignore[import-untyped]  # no stubs: the test's collector only
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pin_runtime.composition import run_command
from pin_runtime.errors import SettingsError
from pin_runtime.settings import CONFIG_ERROR_EXIT_CODE
from pin_runtime.tracing import (
    Headers,
    RedactingExporter,
    configure_tracing,
    extract_context,
    inject_headers,
    shutdown_tracing,
)


def exporters(provider: trace.TracerProvider) -> list[SpanExporter]:
    assert isinstance(provider, TracerProvider)
    # The SDK keeps processors on its multi-processor; there is no public accessor.
    processors = provider._active_span_processor._span_processors
    found: list[SpanExporter] = []
    for processor in processors:
        assert isinstance(processor, BatchSpanProcessor | SimpleSpanProcessor)
        exporter = processor.span_exporter
        # Every exporter is wrapped so that no configured secret leaves in a span.
        assert isinstance(exporter, RedactingExporter)
        found.append(exporter.wrapped)
    return found


def configure(environ: dict[str, str]) -> trace.TracerProvider:
    return configure_tracing("identity-fanout", environ, set_global=False)


def test_nothing_configured_means_no_exporter() -> None:
    provider = configure({})
    assert exporters(provider) == []
    assert provider.get_tracer("t").start_span("s").get_span_context().is_valid
    shutdown_tracing(provider)


def test_none_exporter() -> None:
    provider = configure({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
    assert exporters(provider) == []


@pytest.mark.parametrize(
    ("environ", "endpoint"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
            "http://collector:4318/v1/traces",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"},
            "http://c:4318/custom",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "http://localhost:4318/v1/traces"),
    ],
)
def test_otlp_http_exporter_when_endpoint_configured(
    environ: dict[str, str], endpoint: str
) -> None:
    provider = configure(environ | {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=abc"})
    [exporter] = exporters(provider)
    assert isinstance(exporter, OTLPSpanExporter)
    assert exporter._endpoint == endpoint
    assert exporter._client._headers["api-key"] == "abc"  # private, but no accessor exists
    assert isinstance(provider, TracerProvider)
    assert isinstance(provider._active_span_processor._span_processors[0], BatchSpanProcessor)
    provider.shutdown()


def test_console_exporter() -> None:
    [exporter] = exporters(configure({"OTEL_TRACES_EXPORTER": "console"}))
    assert isinstance(exporter, ConsoleSpanExporter)


def test_unknown_exporter_is_a_settings_error() -> None:
    with pytest.raises(SettingsError) as info:
        configure({"OTEL_TRACES_EXPORTER": "jaeger"})
    assert info.value.variable == "OTEL_TRACES_EXPORTER"


@pytest.mark.parametrize(
    ("environ", "endpoint", "insecure"),
    [
        # gRPC takes the endpoint as it is (no path); http:// is in clear, https:// over TLS.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, "collector:4317", True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317"}, "collector:4317", False),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:14317"}, "c:14317", True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "localhost:4317", True),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"},
            "c:4317",
            True,
        ),
    ],
)
def test_grpc_protocol_selects_the_sdks_grpc_exporter(
    environ: dict[str, str], endpoint: str, insecure: bool
) -> None:
    provider = configure(environ | {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    [exporter] = exporters(provider)
    assert isinstance(exporter, GrpcSpanExporter)
    assert exporter._endpoint == endpoint  # private, but no accessor exists
    assert (exporter._credentials is None) is insecure
    shutdown_tracing(provider)


def test_the_traces_protocol_wins_over_the_general_one() -> None:
    general = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "x"}
    grpc_ = configure(general | {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    assert isinstance(exporters(grpc_)[0], GrpcSpanExporter)
    http = configure(general | {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    assert isinstance(exporters(http)[0], OTLPSpanExporter)
    shutdown_tracing(grpc_)
    shutdown_tracing(http)


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
@pytest.mark.parametrize("protocol", ["http/json", "GRPC", "thrift"])
def test_an_unknown_protocol_is_a_settings_error_naming_its_variable(
    variable: str, protocol: str
) -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", variable: protocol}
    with pytest.raises(SettingsError) as info:
        configure(environ)
    assert info.value.variable == variable
    assert protocol in info.value.reason
    # A command that meets it exits 2, as for every bad setting.
    assert run_command(lambda: bool(configure(environ))) == CONFIG_ERROR_EXIT_CODE


class Collector:
    """What an OTLP collector received: (service.name, span name) per span, and the paths."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []
        self.paths: list[str] = []

    def record(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                self.spans += [(attributes["service.name"], s.name) for s in scope_spans.spans]


@contextmanager
def http_collector() -> Iterator[tuple[str, Collector]]:
    """An OTLP/HTTP collector on loopback: POSTed protobuf requests, answered 200."""
    collector = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            collector.paths.append(self.path)
            collector.record(ExportTraceServiceRequest.FromString(body))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def grpc_collector() -> Iterator[tuple[str, Collector]]:
    """An OTLP/gRPC collector on loopback (the TraceService of opentelemetry-proto)."""
    collector = Collector()

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(  # noqa: N802 - the service's method name
            self, request: ExportTraceServiceRequest, context: Any
        ) -> ExportTraceServiceResponse:
            collector.paths.append("TraceService/Export")
            collector.record(request)
            return ExportTraceServiceResponse()

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
    add(TraceService(), server)  # type: ignore[no-untyped-call]  # generated, untyped
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", collector
    finally:
        server.stop(grace=None).wait()


@pytest.mark.parametrize(
    ("protocol", "stub", "exporter_type", "path"),
    [
        ("grpc", grpc_collector, GrpcSpanExporter, "TraceService/Export"),
        ("http/protobuf", http_collector, OTLPSpanExporter, "/v1/traces"),
    ],
)
def test_a_span_reaches_a_collector_over_either_protocol(
    protocol: str, stub: Any, exporter_type: type[SpanExporter], path: str
) -> None:
    with stub() as (endpoint, collector):
        provider = configure(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
        )
        [exporter] = exporters(provider)
        assert isinstance(exporter, exporter_type)
        with provider.get_tracer("t").start_as_current_span("publish"):
            pass
        shutdown_tracing(provider)  # flushes: the export is done when it returns
        assert collector.spans == [("identity-fanout", "publish")]
        assert collector.paths == [path]


def test_sdk_disabled_is_noop() -> None:
    provider = configure({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(provider, trace.NoOpTracerProvider)
    assert not provider.get_tracer("t").start_span("s").get_span_context().is_valid
    shutdown_tracing(provider)


def test_resource_from_environment() -> None:
    provider = configure({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,team=a%20b"})
    assert isinstance(provider, TracerProvider)
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "identity-fanout"
    assert attributes["deployment.environment"] == "prod"
    assert attributes["team"] == "a b"


def test_the_service_version_is_the_builds_unless_the_environment_names_one() -> None:
    built = configure_tracing("identity-fanout", {}, version="1.4.2", set_global=False)
    assert isinstance(built, TracerProvider)
    assert built.resource.attributes["service.version"] == "1.4.2"
    named = configure_tracing(
        "identity-fanout",
        {"OTEL_RESOURCE_ATTRIBUTES": "service.version=1.4.2-rc1,deployment.environment.name=stg"},
        version="1.4.2",
        set_global=False,
    )
    assert isinstance(named, TracerProvider)
    assert named.resource.attributes["service.version"] == "1.4.2-rc1"
    assert named.resource.attributes["deployment.environment.name"] == "stg"


def test_otel_service_name_wins() -> None:
    provider = configure(
        {"OTEL_SERVICE_NAME": "fanout-canary", "OTEL_RESOURCE_ATTRIBUTES": "service.name=x"}
    )
    assert isinstance(provider, TracerProvider)
    assert provider.resource.attributes["service.name"] == "fanout-canary"


def test_spans_reach_an_exporter() -> None:
    provider = configure({})
    assert isinstance(provider, TracerProvider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("publish"):
        pass
    assert [s.name for s in memory.get_finished_spans()] == ["publish"]


def test_headers_round_trip_parent_child() -> None:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")

    headers: Headers = [("content-type", b"application/json")]
    with tracer.start_as_current_span("produce") as producer_span:
        inject_headers(headers)
    names = [k for k, _ in headers]
    assert names[0] == "content-type"
    assert "traceparent" in names

    consumed: Headers = [*headers, ("null-header", None)]
    with tracer.start_as_current_span("consume", context=extract_context(consumed)):
        pass

    spans = {s.name: s for s in memory.get_finished_spans()}
    consume = spans["consume"]
    assert consume.parent is not None
    assert consume.parent.span_id == producer_span.get_span_context().span_id
    assert consume.context.trace_id == producer_span.get_span_context().trace_id


def test_inject_replaces_old_traceparent() -> None:
    tracer = TracerProvider().get_tracer("t")
    headers: Headers = [("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
    with tracer.start_as_current_span("republish") as span:
        inject_headers(headers)
    [value] = [v for k, v in headers if k == "traceparent"]
    assert isinstance(value, bytes)
    assert format(span.get_span_context().trace_id, "032x").encode() in value


def test_extract_without_headers_is_empty() -> None:
    assert not trace.get_current_span(extract_context(None)).get_span_context().is_valid
    assert not trace.get_current_span(extract_context([])).get_span_context().is_valid


def test_extract_accepts_a_mapping() -> None:
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    span_context = trace.get_current_span(
        extract_context({"traceparent": parent.encode()})
    ).get_span_context()
    assert span_context.span_id == int("b" * 16, 16)


def test_extract_accepts_str_values() -> None:
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    context = extract_context([("TraceParent", parent)])
    span_context = trace.get_current_span(context).get_span_context()
    assert span_context.trace_id == int("a" * 32, 16)
    assert span_context.is_remote
