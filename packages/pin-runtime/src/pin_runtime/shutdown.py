"""SIGTERM/SIGINT to a `threading.Event` the main loop can check or wait on.

The first signal asks for a graceful stop (finish the batch, commit, close); a second one
restores the default action and re-delivers itself, so a second Ctrl-C always exits hard.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Self

from pin_runtime.logging import log_event

__all__ = ["GracefulShutdown"]

_log = logging.getLogger(__name__)

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class GracefulShutdown:
    """Install with `install()` (or `with`), from the main thread; `request()` works anywhere.

    Python runs signal handlers in the main thread between bytecodes: a main loop blocked in
    a C call sees the request when the call returns, so block with timeouts (`poll(1.0)`) or
    on `wait()`.
    """

    def __init__(
        self, *, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        self._signals = tuple(signals)
        self._event = threading.Event()
        # Reentrant: the signal handler runs on the main thread, possibly while it holds the lock.
        self._lock = threading.RLock()
        self._callbacks: list[Callable[[], None]] = []
        self._previous: dict[signal.Signals, _Handler] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until shutdown is requested or `timeout` passes; True if requested."""
        return self._event.wait(timeout)

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` once on the first request (e.g. wake a blocked consumer).

        Added after the request, it runs at once, so nothing waits forever.
        """
        with self._lock:
            self._callbacks.append(callback)
        if self._event.is_set():
            self._run_callbacks()

    def request(self, reason: str = "requested") -> None:
        """Ask for a graceful stop; idempotent; callbacks run once, in the calling thread."""
        with self._lock:
            first = not self._event.is_set()
            self._event.set()
        if first:
            log_event(_log, "shutdown requested", reason=reason)
        self._run_callbacks()

    def _run_callbacks(self) -> None:
        # Whoever comes last (request or a late add_callback) drains the list, so a signal
        # landing between the append and the check cannot strand a callback.
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one failing callback must not stop the others
                _log.exception("shutdown callback failed")

    def install(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were there before `install()`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def __enter__(self) -> Self:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self._event.is_set():
            self.request(name)
            return
        log_event(_log, "second signal: exiting immediately", logging.WARNING, signal=name)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
