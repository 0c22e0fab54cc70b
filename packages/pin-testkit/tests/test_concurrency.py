"""Racing threads: all start together, results and exceptions come back, none hangs a test."""

from __future__ import annotations

import threading

import pytest

from pin_testkit.concurrency import run_together


def test_every_thread_runs_at_once_and_returns_its_result() -> None:
    def task(start: threading.Barrier) -> int:
        start.wait()  # passes only once all four threads are here: they run concurrently
        return threading.get_ident()

    idents = run_together(task, 4, timeout=10)
    assert len(idents) == len(set(idents)) == 4


def test_an_exception_in_a_thread_is_raised_in_the_caller() -> None:
    def task(start: threading.Barrier) -> None:
        if start.wait() == 0:  # exactly one thread gets index 0
            raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        run_together(task, 3, timeout=10)


def test_a_thread_still_running_at_the_timeout_fails_the_call() -> None:
    release = threading.Event()

    def task(start: threading.Barrier) -> None:
        start.wait()
        release.wait(30)

    try:
        with pytest.raises(TimeoutError, match="2 of 2 threads still running"):
            run_together(task, 2, timeout=0.2)
    finally:
        release.set()
