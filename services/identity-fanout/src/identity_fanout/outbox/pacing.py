"""The relay loop's waits: interruptible sleeps, the liveness heartbeat, the stop grace."""

from __future__ import annotations

import threading
import time
from typing import Final

from identity_fanout.outbox.session import WAKE_SLICE
from pin_runtime.http import Heartbeat

__all__ = ["SHUTDOWN_GRACE", "Pacer"]

SHUTDOWN_GRACE: Final = 5.0
"""On stop, how long in-flight deliveries may still take before the relay gives up on them
(they stay in the outbox and go out again later)."""


class Pacer:
    """Sleeps that end at a stop request and beat the heartbeat (if any) meanwhile."""

    def __init__(self, heartbeat: Heartbeat | None) -> None:
        self._heartbeat = heartbeat
        self.stop = threading.Event()
        self._stop_seen_at: float | None = None

    def beat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.beat()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self.stop.wait(min(remaining, WAKE_SLICE)):
                return
            self.beat()

    def give_up(self) -> bool:
        """During a stop, in-flight deliveries get SHUTDOWN_GRACE more, then waits end."""
        if not self.stop.is_set():
            return False
        now = time.monotonic()
        self._stop_seen_at = self._stop_seen_at or now
        return now >= self._stop_seen_at + SHUTDOWN_GRACE
