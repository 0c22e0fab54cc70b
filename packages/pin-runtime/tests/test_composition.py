"""The composition root's shape: exit codes of a command, the long-running runtime."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import platform
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Literal
from uuid import UUID

import msgspec
import psycopg
import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    enable_created_metrics,
)
from prometheus_client.parser import text_string_to_metric_families

from pin_runtime.composition import (
    Cli,
    duration_argument,
    long_running,
    run_command,
    uuid_argument,
    whole_number,
)
from pin_runtime.errors import MigrationError, SettingsError
from pin_runtime.http import ComponentState, Heartbeat
from pin_runtime.metrics import no_created_series
from pin_runtime.settings import Secret


class DomainError(Exception):
    pass


def _raise(exc: Exception) -> None:
    raise exc


@pytest.mark.parametrize(
    ("failure", "code", "line"),
    [
        (
            SettingsError("OTEL_TRACES_EXPORTER", "unknown exporter 'x'"),
            2,
            "config error: OTEL_TRACES_EXPORTER: unknown exporter 'x'",
        ),
        (DomainError("role 42 does not exist"), 1, "error: role 42 does not exist"),
        (MigrationError("0002_x.sql changed after it was applied"), 1, "error: 0002_x.sql ..."),
        (
            psycopg.OperationalError("connection refused\n\tIs the server running?"),
            1,
            "error: database unavailable: connection refused",
        ),
    ],
)
def test_failures_map_to_exit_codes_and_one_line(
    failure: Exception, code: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_command(lambda: _raise(failure), errors=(DomainError,)) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    if line.endswith("..."):
        assert err.startswith(line.removesuffix("..."))
    else:
        assert err == line + "\n"


def test_the_commands_own_code_is_kept_and_none_is_success() -> None:
    assert run_command(lambda: None) == 0
    assert run_command(lambda: 3) == 3


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_error_the_service_did_not_name_is_one_line_and_a_logged_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Not swallowed: exit 1, the operator's one line, the traceback in the log.
    # Only this test's handler: another test's JSON handler may write to a stream it closed.
    root, logger, seen = logging.getLogger(), logging.getLogger("pin_runtime"), _Records()
    kept, root.handlers = root.handlers, []
    logger.addHandler(seen)
    try:
        assert run_command(lambda: _raise(DomainError("bug\nsecond line"))) == 1
    finally:
        logger.removeHandler(seen)
        root.handlers = kept
    assert capsys.readouterr().err == "error: DomainError: bug\n"
    (record,) = [r for r in seen.records if r.getMessage() == "command failed"]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], DomainError)


def test_error_lines_never_show_a_configured_secret(capsys: pytest.CaptureFixture[str]) -> None:
    password = "s3cret-composition-pw"
    Secret(f"postgresql://u:{password}@db/x")
    failure = psycopg.OperationalError(f'invalid dsn: "postgresql://u:{password}@db/x"')
    assert run_command(lambda: _raise(failure)) == 1
    err = capsys.readouterr().err
    assert password not in err
    assert err.startswith("error: database unavailable: invalid dsn")


def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _check(body: dict[str, object]) -> dict[str, object]:
    checks = body["checks"]
    assert isinstance(checks, dict)
    check: dict[str, object] = checks["database"]
    return check


def test_long_running_serves_its_checks_and_stops_on_request() -> None:
    state = ComponentState()
    with long_running(
        "composition-test",
        log_level="WARNING",
        metrics_host="127.0.0.1",
        metrics_port=0,
        heartbeat=Heartbeat(stale_after=60),
    ) as rt:
        ops = rt.serve({"database": state})
        status, body = _get(ops.port, "/readyz")
        assert status == 503
        assert body["status"] == "degraded"
        assert (_check(body)["status"], _check(body)["category"]) == ("degraded", "starting")
        state.ok()
        assert _get(ops.port, "/readyz")[0] == 200
        assert not rt.stop.is_set()
        rt.shutdown.request()  # what SIGTERM does
        assert rt.stop.is_set()
        port = ops.port
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_a_bad_tracing_variable_is_a_config_error_exit_2() -> None:
    probe = (
        "from pin_runtime.composition import Cli, long_running, run_command, uuid_argument\n"
        "from pin_runtime.http import Heartbeat\n"
        "def run():\n"
        "    with long_running('t', log_level='INFO', metrics_host='127.0.0.1', metrics_port=0,"
        " heartbeat=Heartbeat(stale_after=60)):\n"
        "        return 0\n"
        "raise SystemExit(run_command(run))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={"OTEL_TRACES_EXPORTER": "carrier-pigeon", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("config error: OTEL_TRACES_EXPORTER: ")
    assert result.stderr.count("\n") == 1


def test_the_composition_module_loads_no_kafka_client() -> None:
    probe = "import sys, pin_runtime.composition; print('confluent_kafka' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert loaded.stdout.strip() == "False"


class _CliSettings(msgspec.Struct, frozen=True):
    log_level: str = "INFO"


def test_a_cli_command_prints_its_result_alone_on_stdout_and_logs_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIN_CLI_TEST_LOG_LEVLE", "a typo")
    logger = logging.getLogger("pin_cli_test")
    parser = argparse.ArgumentParser(prog="pin-cli-test")
    parser.add_argument("command", choices=["show", "fail"])

    def run(args: argparse.Namespace, settings: _CliSettings) -> int:
        logger.info("audit line")
        print(json.dumps({"command": args.command, "level": settings.log_level}))  # noqa: T201 - the result
        if args.command == "fail":
            raise DomainError("nothing to show")
        return 3

    cli = Cli("pin-cli-test", _CliSettings, "PIN_CLI_TEST_", errors=(DomainError,))
    assert cli.main(parser, run, ["show"]) == 3
    out, err = capsys.readouterr()
    # stdout is the result and nothing else: a script parses it as it is.
    assert json.loads(out) == {"command": "show", "level": "INFO"}
    events = [json.loads(line) for line in err.splitlines()]
    assert [(e["event"], e.get("variable")) for e in events] == [
        ("unknown setting ignored", "PIN_CLI_TEST_LOG_LEVLE"),
        ("audit line", None),
    ]
    assert {e["service"] for e in events} == {"pin-cli-test"}
    assert cli.main(parser, run, ["fail"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"command": "fail", "level": "INFO"}
    assert err.splitlines()[-1] == "error: nothing to show"
    assert [json.loads(line)["event"] for line in err.splitlines()[:-1]] == [
        "unknown setting ignored",
        "audit line",
    ]


def test_a_cli_with_a_bad_setting_exits_2_before_the_command_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIN_CLI_TEST_LOG_LEVEL", "LOUD")
    parser = argparse.ArgumentParser(prog="pin-cli-test")
    parser.add_argument("command")
    cli = Cli("pin-cli-test", _Leveled, "PIN_CLI_TEST_")
    with pytest.raises(SystemExit) as exited:
        cli.main(parser, lambda _args, _settings: pytest.fail("ran"), ["show"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("config error: PIN_CLI_TEST_LOG_LEVEL:")


class _Leveled(msgspec.Struct, frozen=True):
    log_level: Literal["DEBUG", "INFO"] = "INFO"


def test_a_cli_parser_names_the_service_and_takes_uuids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cli = Cli("pin-cli-test", _CliSettings, "PIN_CLI_TEST_")
    parser, commands = cli.parser("A test tool.")
    commands.add_parser("show").add_argument("id", type=uuid_argument)
    assert "Configured by PIN_CLI_TEST_* environment variables" in parser.format_help()
    assert parser.parse_args(["show", str(UUID(int=7))]).id == UUID(int=7)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["show", "seven"])
    assert exited.value.code == 2
    assert "not a UUID: 'seven'" in capsys.readouterr().err


def test_version_names_the_build_and_exits_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIN_BUILD_REVISION", "4f1c2e9")
    parser, _ = Cli("pin-runtime", _CliSettings, "PIN_CLI_TEST_").parser("A test tool.")
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--version"])
    assert exited.value.code == 0
    line = capsys.readouterr().out.strip()
    contracts = importlib.metadata.version("pin-contracts")
    assert line.startswith(f"pin-runtime {importlib.metadata.version('pin-runtime')} ")
    assert f"(revision 4f1c2e9, pin-contracts {contracts}, Python {platform.python_version()})" in (
        line
    )


def test_long_running_exports_process_metrics_and_its_build() -> None:
    with long_running(
        "pin-runtime",
        log_level="WARNING",
        metrics_host="127.0.0.1",
        metrics_port=0,
        heartbeat=Heartbeat(stale_after=60),
    ) as rt:
        ops = rt.serve()
        with urllib.request.urlopen(f"http://127.0.0.1:{ops.port}/metrics", timeout=5) as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    # Memory against the pod's limit, and which build runs: what the private registry lacked.
    [rss] = families["process_resident_memory_bytes"].samples
    assert rss.value > 10 * 2**20
    assert "python_gc_objects_collected" in families
    assert "python_info" in families
    [build] = families["pin_runtime_build_info"].samples
    assert build.value == 1
    assert build.labels["version"] == importlib.metadata.version("pin-runtime")
    assert build.labels["contracts_version"] == importlib.metadata.version("pin-contracts")


def test_a_long_running_process_exports_no_created_series_in_either_format() -> None:
    registry = CollectorRegistry()
    # Metrics made without a MetricSet, and the switch turned back on by whatever ran before:
    # the process's start turns it off all the same.
    Counter("t_events", "Events.", ["kind"], registry=registry).labels("a").inc()
    Histogram("t_seconds", "Seconds.", registry=registry, buckets=(1.0,)).observe(0.5)
    enable_created_metrics()  # type: ignore[no-untyped-call]
    try:
        with long_running(
            "pin-runtime",
            log_level="WARNING",
            metrics_host="127.0.0.1",
            metrics_port=0,
            heartbeat=Heartbeat(stale_after=60),
            registry=registry,
        ) as rt:
            ops = rt.serve()
            url = f"http://127.0.0.1:{ops.port}/metrics"
            texts = []
            for accept in ("text/plain", "application/openmetrics-text; version=1.0.0"):
                request = urllib.request.Request(url, headers={"Accept": accept})
                with urllib.request.urlopen(request, timeout=5) as r:  # noqa: S310 - http://
                    texts.append(r.read().decode())
    finally:
        no_created_series()
    for text in texts:
        assert 't_events_total{kind="a"} 1.0' in text
        assert "t_seconds_bucket" in text
        assert "python_gc_objects_collected_total" in text
        assert "_created" not in text, [line for line in text.splitlines() if "_created" in line]


def test_a_request_made_before_serve_is_answered_with_what_was_built_before_serve() -> None:
    """The address is taken as the command starts; the first answer, even to a request sent
    before, comes once `serve` is called, with the checks and metrics built until then."""
    with long_running(
        "pin-runtime",
        log_level="WARNING",
        metrics_host="127.0.0.1",
        metrics_port=0,
        heartbeat=Heartbeat(stale_after=60),
    ) as rt:
        with socket.create_connection(("127.0.0.1", rt.ops.port), timeout=10) as early:
            early.sendall(b"GET /readyz HTTP/1.0\r\nHost: ops\r\n\r\n")
            Counter("late_component_events", "Built after the request", registry=rt.registry)
            state = ComponentState()
            state.ok()
            rt.serve({"late": state})
            answer = early.makefile("rb").read().decode()
        with urllib.request.urlopen(f"http://127.0.0.1:{rt.ops.port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
    status, _, body = answer.partition("\r\n\r\n")
    assert status.split("\r\n")[0].split()[1] == "200"
    assert list(json.loads(body)["checks"]) == ["late"]
    assert "late_component_events_total 0.0" in metrics


def test_a_metrics_address_already_taken_is_refused_before_anything_is_served() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with (
            pytest.raises(SettingsError) as refused,
            long_running(
                "pin-runtime",
                log_level="WARNING",
                metrics_host="127.0.0.1",
                metrics_port=port,
                heartbeat=Heartbeat(stale_after=60),
                env_prefix="SVC_",
            ),
        ):
            pass
    assert refused.value.variable == "SVC_METRICS_PORT"


@pytest.mark.parametrize(
    ("text", "refusal"),
    [("ten", "not a whole number: 'ten'"), ("0", "0 is out of range: from 1 to 5"), ("6", "6 is")],
)
def test_a_whole_number_outside_its_range_is_a_usage_error(text: str, refusal: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=refusal):
        whole_number(1, 5)(text)


def test_a_whole_number_in_its_range_is_taken() -> None:
    assert [whole_number(1, 5)(t) for t in ("1", "5")] == [1, 5]


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("5", "has no unit"),  # seconds or days: a guess
        ("5 parsecs", "not a duration"),
        ("99999999999999d", "not a duration"),
        ("30m", "out of range: from 1h to 3650d"),
        ("3651d", "out of range"),
    ],
)
def test_a_duration_needs_its_unit_and_its_range(text: str, refusal: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=refusal):
        duration_argument("1h", "3650d")(text)


def test_a_duration_in_its_range_is_taken() -> None:
    parse = duration_argument("1h", "3650d")
    assert (parse("1h"), parse("30d")) == (timedelta(hours=1), timedelta(days=30))
