"""Which partition each record goes to, and whether a topic's partitions still allow it. Pure.

The catalogue's partition count is part of a topic's contract: the relay names every
record's partition itself, `pin_contracts.key_partition` of its key by the catalogue's
count (librdkafka's own default choice, so no key moved when this came in). A topic grown
behind the contract's back (3 -> 6) then moves no key: one key's records stay on one
partition, in order, for a live consumer and for a replay from offset 0, and nothing waits
for a consumer to notice the new partitions, because nothing is written there.

The relay compares each topic's count in the cluster's metadata with the catalogue's, at its
first round and every `CHECK_INTERVAL` seconds after (one metadata request per topic it
publishes); a topic it waits on (fewer partitions, or none) is looked at again at every try.
More partitions than the catalogue: published as before, pinned. Fewer, or no such topic:
a pinned partition may not exist, so the topic's records are refused before they are
produced, as the cluster would refuse them (`refusal`), and the relay pauses for it through
its pause (`rules.TOPIC_REFUSALS`) until the counts match again. A topic outside the
catalogue (another service's outbox, a test's) is pinned to the count it had when the relay
first saw it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from confluent_kafka import KafkaError, KafkaException

from pin_contracts import CATALOGUE, key_partition

__all__ = ["CHECK_INTERVAL", "Change", "TopicPartitions", "catalogue_partitions"]

CHECK_INTERVAL: Final = 15.0
"""Seconds between the relay's looks at its topics' partition counts."""
RECHECK_INTERVAL: Final = 1.0
"""Seconds between looks at a topic the relay waits on (or could not see): at most one
metadata request a second however often it retries."""


def catalogue_partitions() -> dict[str, int]:
    """The catalogue's count of each event topic (its dead-letter topics are no relay's)."""
    return {t.name: t.partitions for t in CATALOGUE if t.dead_letter_of is None}


@dataclass(frozen=True, slots=True)
class Change:
    """A topic's observed partition count changed (None: the cluster has no such topic)."""

    topic: str
    observed: int | None
    expected: int

    @property
    def matches(self) -> bool:
        return self.observed == self.expected


@dataclass
class TopicPartitions:
    """The count each topic's records are pinned to, and what the cluster has of each."""

    expected: dict[str, int]
    """The catalogue's partition count per topic (then the first seen of others)."""
    observed: dict[str, int | None] = field(default_factory=dict)
    next_check: float = 0.0
    next_recheck: float = 0.0
    looked: set[str] = field(default_factory=set)
    """Topics the relay asked the metadata about (whether it answered or not)."""

    @classmethod
    def of(cls, catalogue: Mapping[str, int]) -> TopicPartitions:
        return cls(dict(catalogue))

    def due(self, topics: set[str], now: float) -> set[str]:
        """The topics to look at now: all at the interval, and any not seen or not usable."""
        if now >= self.next_check:
            return topics | self.expected.keys()
        new = topics - self.looked  # first sight: looked at before its first record goes
        if now < self.next_recheck:
            return new
        return new | {t for t in topics if t not in self.observed or not self.usable(t)}

    def observe(
        self, counts: Mapping[str, int | None], now: float, *, looked: set[str]
    ) -> list[Change]:
        """Take a look at `looked`: the counts it answered (None: no such topic); the changes
        to report."""
        self.looked |= looked
        if now >= self.next_check:
            self.next_check = now + CHECK_INTERVAL
        self.next_recheck = now + RECHECK_INTERVAL
        changes = []
        for topic, count in counts.items():
            if topic not in self.expected and count is not None:
                self.expected[topic] = count  # outside the catalogue: as first seen
            if topic in self.observed and self.observed[topic] == count:
                continue
            first = topic not in self.observed
            self.observed[topic] = count
            expected = self.expected.get(topic)
            if expected is not None and not (first and count == expected):
                changes.append(Change(topic, count, expected))
        return changes

    def usable(self, topic: str) -> bool:
        """False once the relay saw `topic` missing or with fewer partitions than pinned to.
        Not seen (metadata failed): usable, the cluster answers for itself."""
        if topic not in self.observed:
            return True
        observed, expected = self.observed[topic], self.expected.get(topic)
        return observed is not None and (expected is None or observed >= expected)

    def partition(self, topic: str, key: bytes) -> int:
        """The partition of `key` on `topic`; -1 (librdkafka's choice, the same function of
        the count it knows) for a topic outside the catalogue the relay has not seen yet."""
        expected = self.expected.get(topic)
        return -1 if expected is None else key_partition(key, expected)

    def refusal(self, topic: str) -> KafkaException:
        """What producing to an unusable `topic` would meet: the cluster's own answers."""
        observed, expected = self.observed.get(topic), self.expected.get(topic)
        if observed is None:
            return KafkaException(
                KafkaError(
                    KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic {topic} is not in the metadata"
                )
            )
        return KafkaException(
            KafkaError(
                KafkaError._UNKNOWN_PARTITION,
                f"topic {topic} has {observed} partitions, the catalogue {expected}: "
                "records pinned to the missing ones wait",
            )
        )
