"""Exponential backoff with jitter, pure: it computes delays and never sleeps."""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """Delays whose base grows `initial`, `initial*multiplier`, ... up to `maximum`.

    Jitter is subtractive: a delay lies in `[base * (1 - jitter), base]`, so it never exceeds
    `maximum` and never exceeds the documented schedule, while paused partitions of many
    consumers still spread out instead of hitting a recovering database at once.
    """

    __slots__ = ("_base", "_rng", "attempts", "initial", "jitter", "maximum", "multiplier")

    def __init__(
        self,
        *,
        initial: float = 1.0,
        maximum: float = 60.0,
        multiplier: float = 2.0,
        jitter: float = 0.25,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0:
            raise ValueError(f"initial must be > 0, got {initial}")
        if maximum < initial:
            raise ValueError(f"maximum must be >= initial, got {maximum} < {initial}")
        if multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {multiplier}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter must be within [0, 1], got {jitter}")
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self._rng = rng or random.Random()  # noqa: S311 - spreading retries, not secrets
        self._base = initial
        self.attempts = 0

    @property
    def base(self) -> float:
        """The un-jittered delay the next `next_delay()` is drawn from."""
        return self._base

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; advances the schedule."""
        base = self._base
        self.attempts += 1
        # Clamp each step (no float overflow however long the outage lasts).
        self._base = min(self.maximum, base * self.multiplier)
        return base * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        """Back to `initial` after a success."""
        self._base = self.initial
        self.attempts = 0
