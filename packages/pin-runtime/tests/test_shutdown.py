from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

from pin_runtime.shutdown import GracefulShutdown


@pytest.fixture
def shutdown() -> Iterator[GracefulShutdown]:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    guard = GracefulShutdown().install()
    yield guard
    guard.uninstall()
    assert {s: signal.getsignal(s) for s in before} == before


def test_sigterm_requests_shutdown(shutdown: GracefulShutdown) -> None:
    assert not shutdown.requested
    os.kill(os.getpid(), signal.SIGTERM)
    # The handler runs in the main thread at the next bytecode boundary; wait bounded.
    assert shutdown.wait(5.0)
    assert shutdown.requested


def test_sigint_requests_shutdown(shutdown: GracefulShutdown) -> None:
    os.kill(os.getpid(), signal.SIGINT)
    assert shutdown.wait(5.0)


def test_wait_times_out_when_not_requested(shutdown: GracefulShutdown) -> None:
    assert not shutdown.wait(0.01)


def test_callbacks_run_once_and_failures_are_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = GracefulShutdown()
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    guard.add_callback(lambda: calls.append("a"))
    guard.add_callback(broken)
    guard.add_callback(lambda: calls.append("b"))
    guard.request("test")
    guard.request("again")
    assert calls == ["a", "b"]
    assert "shutdown callback failed" in caplog.text

    guard.add_callback(lambda: calls.append("late"))  # after the request: runs at once
    assert calls == ["a", "b", "late"]


def test_request_from_another_thread_wakes_waiter() -> None:
    guard = GracefulShutdown()
    threading.Thread(target=guard.request).start()
    assert guard.wait(5.0)


def test_install_outside_main_thread_rejected() -> None:
    errors: list[BaseException] = []

    def install() -> None:
        try:
            GracefulShutdown().install()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join(5.0)
    assert len(errors) == 1


def test_context_manager_restores_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with GracefulShutdown() as guard:
        assert signal.getsignal(signal.SIGTERM) != before
        assert not guard.requested
    assert signal.getsignal(signal.SIGTERM) == before


def test_second_signal_exits_hard() -> None:
    # In a child process: the default action of SIGTERM kills whoever receives it.
    script = textwrap.dedent(
        """
        import os, signal, sys
        from pin_runtime.shutdown import GracefulShutdown
        guard = GracefulShutdown().install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.wait(5.0)
        print("graceful", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        guard.wait(5.0)
        print("still alive", flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.stdout == "graceful\n"
    assert result.returncode == -signal.SIGTERM
