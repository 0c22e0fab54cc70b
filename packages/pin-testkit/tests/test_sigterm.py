"""A test run stopped with SIGTERM still tears its fixtures down (processes they started)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from pin_testkit.waiting import wait_until

_CONFTEST = """
import os
import pathlib
import subprocess
import pytest

@pytest.fixture
def child():
    process = subprocess.Popen(["sleep", "600"])
    # Written whole under another name, then renamed: the test never reads a half-written file.
    target = pathlib.Path(os.environ["CHILD_PID_FILE"])
    target.with_suffix(".tmp").write_text(str(process.pid))
    target.with_suffix(".tmp").rename(target)
    yield process
    process.terminate()
    process.wait()
"""

_TEST = """
import time

def test_runs_until_stopped(child):
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for good: it only waits for its parent to read its status.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_sigterm_tears_fixtures_down(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(_CONFTEST)
    (suite / "test_slow.py").write_text(_TEST)
    pid_file = tmp_path / "child.pid"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        env={**os.environ, "CHILD_PID_FILE": str(pid_file)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(pid_file.exists, timeout=60, what="the suite's fixture started its child")
        child = int(pid_file.read_text())
        assert _alive(child)
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        assert run.stdout is not None
        run.stdout.close()  # not left to the garbage collector: a ResourceWarning elsewhere
    leaked = _alive(child)
    if leaked:  # the failure must not leave it behind either
        os.kill(child, signal.SIGKILL)
    assert not leaked, output.decode()
    # Interrupted, not killed by the signal: pytest's own exit code for an interrupted run.
    assert run.returncode == 2, output.decode()
