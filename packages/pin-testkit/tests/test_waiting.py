"""wait_until: a condition polled until a deadline, and what a timeout or a crash says."""

from __future__ import annotations

import itertools
import time

import pytest

from pin_testkit.waiting import ConditionTimeoutError, wait_until


class _Process:
    """A watched process that has exited (or not) and logged a line."""

    name = "worker"

    def __init__(self, *, exited: bool) -> None:
        self.exited = exited

    def assert_running(self) -> None:
        if self.exited:
            raise AssertionError("worker exited with 1: boom")

    def log_tail(self, lines: int = 25) -> str:
        return "last line of the worker"


def test_returns_once_the_condition_holds_with_the_time_it_took() -> None:
    calls = itertools.count()
    took = wait_until(lambda: next(calls) >= 3, 5, "the third poll", interval=0.01)
    assert next(calls) == 4  # polled four times (0..3): stopped at the first truthy one
    assert 0 <= took < 1


def test_a_condition_true_at_once_is_not_slept_on() -> None:
    assert wait_until(lambda: True, 0.0) < 0.01


def test_timeout_is_an_assertion_naming_what_was_awaited() -> None:
    started = time.monotonic()
    with pytest.raises(ConditionTimeoutError, match=r"^not within 0.2s: the relay drained$"):
        wait_until(lambda: False, 0.2, "the relay drained", interval=0.01)
    assert 0.2 <= time.monotonic() - started < 2
    assert issubclass(ConditionTimeoutError, AssertionError)


def test_timeout_without_a_description_names_the_condition() -> None:
    def outbox_empty() -> bool:
        return False

    with pytest.raises(ConditionTimeoutError, match="outbox_empty"):
        wait_until(outbox_empty, 0.05, interval=0.01)


def test_timeout_shows_the_log_tails_of_watched_processes() -> None:
    with pytest.raises(ConditionTimeoutError, match="worker: last line of the worker"):
        wait_until(lambda: False, 0.05, "ready", interval=0.01, alive=[_Process(exited=False)])


def test_a_watched_process_that_exited_fails_the_wait_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match="worker exited with 1: boom"):
        wait_until(lambda: False, 30, "ready", alive=[_Process(exited=True)])
    assert time.monotonic() - started < 1
