"""ServiceProcess and run_cli against a real process with /readyz and /metrics.

The process is the interpreter's own console script (``python``) running a small HTTP
server shaped like the services' ops server, so the launcher is tested without a database.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pin_testkit.ports import free_port
from pin_testkit.service import (
    CommandFailedError,
    ServiceProcess,
    run_cli,
    sample_key,
    script,
    service_environment,
)
from pin_testkit.waiting import wait_until

PYTHON = Path(sys.executable).name

# Ready after a moment; exports a counter; exits 3 on SIGTERM (the services exit 0: the code
# is what the test checks is handed back).
SERVER = """
import http.server, os, signal, sys, time
time.sleep(0.3)
port = int(os.environ["PROBE_PORT"])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/readyz":
            body, status = b"ok", 200
        elif self.path == "/metrics":
            body = (
                "# TYPE probe_sent_total counter\\n"
                'probe_sent_total{topic="a"} 7.0\\n'
                "# TYPE probe_up gauge\\nprobe_up 1.0\\n"
            ).encode()
            status = 200
        else:
            body, status = b"no", 404
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
print("probe listening", flush=True)
print(os.environ.get("PROBE_SETTING", "-"), flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def probe(tmp_path: Path, code: str = SERVER) -> ServiceProcess:
    port = free_port()
    env = service_environment(PROBE_PORT=str(port), PROBE_SETTING="configured")
    return ServiceProcess(
        name="probe",
        program=PYTHON,
        args=("-c", code),
        env=env,
        metrics_port=port,
        log_path=tmp_path / "probe.log",
    )


def test_started_process_gets_ready_exports_metrics_and_stops_with_its_exit_code(
    tmp_path: Path,
) -> None:
    with probe(tmp_path) as process:
        assert not process.ready()
        process.start()
        assert process.wait_ready(timeout=30) > 0
        assert process.running()
        assert process.metric("probe_sent_total", topic="a") == 7.0
        assert process.metric("probe_up") == 1.0
        assert process.metric("probe_absent_total") == 0.0
        assert process.metrics()['probe_sent_total{topic="a"}'] == 7.0
        assert process.get("/nowhere")[0] == 404
        assert process.terminate(timeout=30) == 3
        assert not process.running()
    log = process.log_text()
    assert log.startswith(f"=== start {PYTHON} -c")
    assert "probe listening\nconfigured" in log


def test_kill_is_a_crash_and_start_runs_it_again_on_the_same_port(tmp_path: Path) -> None:
    with probe(tmp_path) as process:
        process.start().wait_ready(timeout=30)
        assert process.kill() == -9
        process.start().wait_ready(timeout=30)
        assert process.terminate(timeout=30) == 3
        assert process.exit_codes == [-9, 3]
        assert process.log_text().count("=== start") == 2


def test_a_process_that_exits_fails_its_readiness_wait_at_once_with_its_log(
    tmp_path: Path,
) -> None:
    with probe(tmp_path, "print('no database'); raise SystemExit(2)") as process:
        process.start()
        with pytest.raises(AssertionError, match=r"probe exited with 2: (.|\n)*no database"):
            process.wait_ready(timeout=60)


def test_cleanup_stops_what_the_caller_left_running(tmp_path: Path) -> None:
    process = probe(tmp_path).start()
    with process:
        wait_until(process.ready, 30, "probe ready")
    assert not process.running()


def test_environment_drops_the_prefixes_it_is_told_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDENTITY_FANOUT_DATABASE_DSN", "leaked")
    monkeypatch.setenv("PIN_KEPT", "kept")
    env = service_environment(("IDENTITY_FANOUT_",), COLUMNS="240")
    assert "IDENTITY_FANOUT_DATABASE_DSN" not in env
    assert env["PIN_KEPT"] == "kept"
    assert env["COLUMNS"] == "240"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_run_cli_returns_output_and_fails_on_a_non_zero_exit() -> None:
    env = service_environment()
    done = run_cli(PYTHON, ["-c", "print('hello'); import sys; print('x', file=sys.stderr)"], env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "hello\n", "x\n")
    refused = run_cli(PYTHON, ["-c", "raise SystemExit(4)"], env, check=False)
    assert refused.returncode == 4
    with pytest.raises(CommandFailedError, match=r"-> 4"):
        run_cli(PYTHON, ["-c", "raise SystemExit(4)"], env)


def test_script_is_the_console_script_next_to_the_interpreter() -> None:
    assert script(PYTHON) == str(Path(sys.executable).with_name(PYTHON))
    with pytest.raises(FileNotFoundError, match="no-such-service"):
        script("no-such-service")


def test_sample_key_sorts_labels() -> None:
    assert sample_key("m", {}) == "m"
    assert sample_key("m", {"b": "2", "a": "1"}) == 'm{a="1",b="2"}'
