"""Which partitions are paused, why, since when and until when: pure bookkeeping.

A partition is paused when a failure keeps its records from being finished: a database
outage pauses every partition of the batch, a dead letter that cannot be written pauses
only its own. Each partition has its own backoff (1 s -> 60 s), so one partition failing
again and again does not slow the retries of the others. The consumer does the Kafka side
(pause, seek, resume); this class only decides, and takes the time as an argument so its
tests need no clock and no broker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pin_runtime.backoff import Backoff

__all__ = ["PartitionPauser", "Pause"]


@dataclass(slots=True)
class Pause:
    """One paused partition."""

    dependency: str
    """What failed: postgresql (probed before resuming), kafka."""
    reason: str
    since: float
    """When the partition was first paused (kept across retries until it resumes)."""
    retry_at: float
    seek_to: int | None
    """The offset it resumes from: its first record of the failed batch (None: a partition
    paused on assignment, which resumes from its committed offset)."""
    attempts: int = field(default=1)


class PartitionPauser:
    def __init__(self, *, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._pauses: dict[int, Pause] = {}
        self._backoffs: dict[int, Backoff] = {}

    def _backoff(self, partition: int) -> Backoff:
        backoff = self._backoffs.get(partition)
        if backoff is None:
            backoff = self._backoffs[partition] = Backoff(
                initial=self._initial, maximum=self._maximum
            )
        return backoff

    def pause(
        self, partition: int, *, seek_to: int | None, dependency: str, reason: str, now: float
    ) -> Pause:
        """Pause (or keep paused) `partition` until its next backoff delay has passed."""
        delay = self._backoff(partition).next_delay()
        current = self._pauses.get(partition)
        pause = Pause(
            dependency=dependency,
            reason=reason,
            since=current.since if current is not None else now,
            retry_at=now + delay,
            seek_to=seek_to,
            attempts=self._backoffs[partition].attempts,
        )
        self._pauses[partition] = pause
        return pause

    def hold(self, partition: int, like: Pause, *, now: float) -> Pause:
        """Pause a newly assigned partition until `like`'s retry (its dependency is down)."""
        pause = Pause(
            dependency=like.dependency,
            reason=like.reason,
            since=now,
            retry_at=like.retry_at,
            seek_to=None,
        )
        self._pauses[partition] = pause
        return pause

    def postpone(self, partition: int, *, now: float) -> Pause:
        """A retry that found the dependency still down: wait the next delay."""
        pause = self._pauses[partition]
        return self.pause(
            partition,
            seek_to=pause.seek_to,
            dependency=pause.dependency,
            reason=pause.reason,
            now=now,
        )

    def due(self, now: float) -> list[int]:
        """Paused partitions whose retry time has come, in partition order."""
        return sorted(p for p, pause in self._pauses.items() if pause.retry_at <= now)

    def resume(self, partitions: Iterable[int]) -> None:
        """The partitions are read again; their backoff continues until a batch succeeds."""
        for partition in partitions:
            self._pauses.pop(partition, None)

    def succeeded(self, partitions: Iterable[int]) -> None:
        """A batch of these partitions was committed: their next failure starts at 1 s."""
        for partition in partitions:
            backoff = self._backoffs.get(partition)
            if backoff is not None:
                backoff.reset()

    def forget(self, partitions: Iterable[int]) -> None:
        """Revoked or lost: the next owner starts afresh."""
        for partition in partitions:
            self._pauses.pop(partition, None)
            self._backoffs.pop(partition, None)

    def get(self, partition: int) -> Pause | None:
        return self._pauses.get(partition)

    def is_paused(self, partition: int) -> bool:
        return partition in self._pauses

    @property
    def paused(self) -> frozenset[int]:
        return frozenset(self._pauses)

    def paused_for(self, now: float) -> dict[int, float]:
        """Seconds each paused partition has been paused."""
        return {p: max(0.0, now - pause.since) for p, pause in self._pauses.items()}

    def down(self, dependency: str) -> Pause | None:
        """A pause for `dependency` (the earliest retry), if that dependency is down."""
        pauses = [p for p in self._pauses.values() if p.dependency == dependency]
        return min(pauses, key=lambda p: p.retry_at) if pauses else None

    def dependencies(self) -> set[str]:
        return {pause.dependency for pause in self._pauses.values()}
