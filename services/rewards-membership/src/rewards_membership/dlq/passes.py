"""What `dlq replay` and `dlq resolve` share: a pass over DLQ records, page by page.

Each page is checked against the audit tables at once (which records were replayed, which
resolved) instead of one query per record; the records may be a stream (`dlq ... --all`
over a large DLQ is never held in memory whole).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeVar

import psycopg
from confluent_kafka import Consumer
from psycopg.rows import TupleRow

from rewards_membership.dlq.topic import DeadLetterRecord
from rewards_membership.store import Position, Resolution, fetch_replays, fetch_resolutions

__all__ = ["DeadLetterPass", "History"]

PAGE: Final = 200

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class History:
    """What the audit tables say of a page's records, by (DLQ partition, offset)."""

    replayed: dict[Position, datetime]
    resolved: dict[Position, Resolution]


@dataclass(eq=False, kw_only=True)
class DeadLetterPass:
    """The database (marks and audit tables), a consumer reading originals back from their
    source topic, and the DLQ topic the records come from."""

    conn: psycopg.Connection[TupleRow]
    source: Consumer
    dlq_topic: str
    read_timeout: float = 10.0

    def each_page(
        self,
        records: Iterable[DeadLetterRecord],
        handle: Callable[[Sequence[DeadLetterRecord], History], Iterator[R]],
    ) -> Iterator[R]:
        """`handle(page, what the audit tables say of it)` for each page, results in order."""
        iterator = iter(records)
        while page := list(itertools.islice(iterator, PAGE)):
            positions = [(r.partition, r.offset) for r in page]
            history = History(
                replayed=fetch_replays(self.conn, self.dlq_topic, positions),
                resolved=fetch_resolutions(self.conn, self.dlq_topic, positions),
            )
            yield from handle(page, history)
