"""A record of a batch and what became of it: one shape from the batch statement's decision
to the report (`batch.Batches` builds it once the transaction committed, the DLQ step adds
the receipt, `report` and `spans` read it)."""

from __future__ import annotations

import msgspec
from confluent_kafka import Message

from rewards_membership.dlq.writer import Position, Receipt
from rewards_membership.records import offset_of, partition_of
from rewards_membership.rules.plan import Outcome
from rewards_membership.rules.validation import Item

__all__ = ["Decided"]


class Decided(msgspec.Struct):
    """One committed record: the message, what validation made of it, its outcome (the
    statement's; a dead letter this process wrote in an earlier try of the batch, or a
    duplicate of what an earlier try committed, is reported as what it was), and where its
    dead letter is. A Struct: a batch builds thousands, on the poll thread."""

    message: Message
    item: Item
    outcome: Outcome
    receipt: Receipt | None = None
    """Where its dead letter is in the DLQ, when this process wrote it."""

    @property
    def partition(self) -> int:
        return partition_of(self.message)

    @property
    def position(self) -> Position:
        return (partition_of(self.message), offset_of(self.message))
