"""What is applied and may be committed, per partition: pure bookkeeping of offsets.

An offset enters the ledger once its batch is applied in the database and its dead letters
are acknowledged; it leaves when Kafka confirmed the commit. Whatever sits in the ledger is
committed before a revoked partition moves on (rebalance safety) and on shutdown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["OffsetLedger"]


class OffsetLedger:
    def __init__(self) -> None:
        self._pending: dict[int, int] = {}

    def applied(self, offsets: Mapping[int, int]) -> None:
        """`offsets`: partition -> next offset to read (last finished + 1)."""
        for partition, offset in offsets.items():
            if offset > self._pending.get(partition, -1):
                self._pending[partition] = offset

    def committable(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """Applied but not yet committed offsets (of `partitions`, or of all)."""
        if partitions is None:
            return dict(self._pending)
        return {p: self._pending[p] for p in partitions if p in self._pending}

    def committed(self, offsets: Mapping[int, int]) -> None:
        """Kafka confirmed these; a later applied offset of the same partition stays."""
        for partition, offset in offsets.items():
            if self._pending.get(partition) == offset:
                del self._pending[partition]

    def forget(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._pending.pop(partition, None)
