"""What a history run records: every writing transaction (its rows, when each row took its
id, when the transaction ended and how) and every record read back from the topic.

Pure values, no I/O: the checks (`checks`) are functions of a `History`, and a unit test
builds one by hand. Times are wall-clock seconds (`time.time()`), the clock the relay's
producer stamps its records with (Kafka's CreateTime, same machine).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Final

__all__ = [
    "SLOTS",
    "History",
    "Outcome",
    "Publication",
    "Row",
    "Txn",
    "WriterKind",
    "from_json",
    "key_slot",
    "payload",
    "to_json",
    "token_of",
]

SLOTS: Final = 64
"""identity.outbox_key_slot's modulus (migration 0008)."""


def key_slot(key: str) -> int:
    """A key's slot as the outbox computes it: sha256's first byte modulo 64."""
    return hashlib.sha256(key.encode()).digest()[0] % SLOTS


class WriterKind(StrEnum):
    """Who wrote a transaction; the values are what the report prints."""

    SERIALIZED = "serialized"
    """One key's writers one after the other: the next takes its id only after the previous
    one committed (a per-key lock held from before the insert until after the commit), so
    the key's ids are in commit order."""
    UNSERIALIZED = "unserialized"
    """Several writers of one key at once, each committing late."""
    FLOOD = "flood"
    """Many rows a second, committed at once."""
    FANOUT = "fan-out"
    """One row for each of many users in one transaction, in slot order (the shape of the
    fan-out worker's page), committed at once."""
    PREPARED = "prepared"
    """A foreign writer: raw INSERTs without NOTIFY, PREPARE TRANSACTION, COMMIT PREPARED
    later (or ROLLBACK PREPARED)."""


class Outcome(StrEnum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    IN_DOUBT = "in doubt"
    """The commit was sent and failed on the way: it may or may not have happened."""


@dataclass(frozen=True, slots=True)
class Row:
    """One outbox row a transaction wrote."""

    token: str
    """The row's identity, carried in its payload: how a record maps to its commit."""
    key: str
    id: int
    """Its outbox id."""
    inserted_at: float
    """Just before its INSERT was sent: from then on its transaction may hold the slot."""
    seq: int | None = None
    """A serialized key's row: its place in the key's commit order (1, 2, ...), known by
    construction; None for the others and for an aborted row."""

    @property
    def slot(self) -> int:
        return key_slot(self.key)


@dataclass(frozen=True, slots=True)
class Txn:
    """One writing transaction, as its writer saw it."""

    name: str
    kind: WriterKind
    rows: tuple[Row, ...]
    began_at: float
    """Just before its first INSERT."""
    commit_sent_at: float
    """Just before COMMIT (COMMIT PREPARED, ROLLBACK, ...) was sent."""
    ended_at: float
    """When that returned: the transaction is over."""
    outcome: Outcome
    prepared_at: float | None = None
    """When PREPARE TRANSACTION returned (a prepared writer's)."""

    def holds_from(self, slot: int) -> float | None:
        """When it first wrote into `slot` (None: never), and so from when a per-slot writer
        lock taken before each row's id would be held until `ended_at`."""
        times = [r.inserted_at for r in self.rows if r.slot == slot]
        return min(times) if times else None


@dataclass(frozen=True, slots=True)
class Publication:
    """One record read back from the run's topic."""

    partition: int
    offset: int
    timestamp: float
    """Its CreateTime in seconds: when the relay produced it."""
    key: str
    token: str | None
    """The payload's token (None: no payload of this run's writers)."""


@dataclass
class History:
    """Everything one run recorded (`started`: wall time of its start, for the timeline)."""

    started: float
    txns: list[Txn] = field(default_factory=list)
    publications: list[Publication] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    """(wall time, what happened): the faults and the phases, for the report."""
    bystanders: list[tuple[float, float, str]] = field(default_factory=list)
    """(begun, ended, what) of each transaction held beside the writers that writes no
    outbox row (an unrelated prepared transaction, a long one holding an id)."""
    restarted_at: float | None = None
    """When every relay was restarted to fetch rows still missing once the run settled
    (None: none was missing)."""

    def note(self, at: float, what: str) -> None:
        self.events.append((at, what))


def payload(token: str, key: str, kind: WriterKind) -> bytes:
    """A row's payload: its token first, what a record is mapped back by."""
    return json.dumps({"token": token, "key": key, "writer": kind.value}).encode()


def token_of(value: bytes | None) -> str | None:
    """The token of a record's value (None: not a payload of `payload`)."""
    if value is None:
        return None
    try:
        document = json.loads(value)
    except ValueError:
        return None
    token = document.get("token") if isinstance(document, dict) else None
    return token if isinstance(token, str) else None


def to_json(history: History) -> str:
    """The whole history as one JSON document (`from_json` reads it back): what a run keeps
    beside its report, to look at a failure again without running it."""
    return json.dumps(asdict(history))


def from_json(text: str) -> History:
    document = json.loads(text)
    txns = [
        Txn(
            name=t["name"],
            kind=WriterKind(t["kind"]),
            rows=tuple(Row(**r) for r in t["rows"]),
            began_at=t["began_at"],
            commit_sent_at=t["commit_sent_at"],
            ended_at=t["ended_at"],
            outcome=Outcome(t["outcome"]),
            prepared_at=t["prepared_at"],
        )
        for t in document["txns"]
    ]
    return History(
        started=document["started"],
        txns=txns,
        publications=[Publication(**p) for p in document["publications"]],
        events=[(at, what) for at, what in document["events"]],
        bystanders=[(begun, ended, what) for begun, ended, what in document["bystanders"]],
        restarted_at=document["restarted_at"],
    )
