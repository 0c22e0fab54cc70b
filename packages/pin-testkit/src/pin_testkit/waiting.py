"""Waiting for a condition with a deadline: the one way tests, the demo and benchmarks wait.

A fixed sleep is either too short on a busy machine or wastes time on an idle one; polling a
condition until a deadline is neither. The timeout error names what was awaited, and when
service processes are watched (``alive``), a crash fails the wait at once with the process's
log tail instead of after the whole timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol

__all__ = ["DEFAULT_INTERVAL", "ConditionTimeoutError", "Watched", "wait_until"]

DEFAULT_INTERVAL: Final = 0.05


class ConditionTimeoutError(AssertionError):
    """A condition did not hold within its deadline.

    An ``AssertionError``: in a test it is the test's failure, reported like an ``assert``.
    """


class Watched(Protocol):
    """Something that runs while a condition is awaited (a service process)."""

    @property
    def name(self) -> str: ...

    def assert_running(self) -> None:
        """Raise (with what the process said) if it has exited."""

    def log_tail(self, lines: int = 25) -> str:
        """The end of what it logged, for a timeout's message."""


def wait_until(
    condition: Callable[[], object],
    timeout: float = 60.0,
    what: str = "",
    *,
    interval: float = DEFAULT_INTERVAL,
    alive: Sequence[Watched] = (),
) -> float:
    """Poll ``condition`` every ``interval`` seconds until it is truthy; the seconds it took.

    Raises :class:`ConditionTimeoutError` after ``timeout`` seconds, naming ``what`` (and the
    log tails of ``alive``); fails at once when one of ``alive`` has exited.
    """
    started = time.monotonic()
    deadline = started + timeout
    while not condition():
        for process in alive:
            process.assert_running()
        if time.monotonic() >= deadline:
            details = "".join(f"\n{p.name}: {p.log_tail()}" for p in alive)
            raise ConditionTimeoutError(
                f"not within {timeout:g}s: {what or _describe(condition)}{details}"
            )
        time.sleep(interval)
    return time.monotonic() - started


def _describe(condition: Callable[[], object]) -> str:
    return getattr(condition, "__qualname__", None) or repr(condition)
