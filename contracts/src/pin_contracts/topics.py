"""The topics the identity events travel on, and who reads them."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

from pin_contracts.access import UserAccessChangedKafkaEvent
from pin_contracts.event import EventStruct
from pin_contracts.membership import AgentMembershipChanged

__all__ = [
    "AGENT_MEMBERSHIP_CHANGED",
    "CATALOGUE",
    "IDENTITY_MEMBERSHIP_DLQ",
    "REWARDS_MEMBERSHIP_CONSUMER_GROUP",
    "USER_ACCESS_CHANGED",
    "Topic",
    "key_partition",
]


_ONE_MIB = 1_048_576


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a record key among `partitions`: CRC32 of the key bytes modulo the count.

    The choice librdkafka's default partitioner (`consistent_random`) makes for a non-empty
    key, so pinning a producer to it moved no key when it came in. Computed from the
    catalogue's count, not the cluster's: a topic grown behind the contract's back keeps
    every key on the partition it had, and so its order (docs/design/identity-fanout.md
    "Partitions").
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return zlib.crc32(key) % partitions


@dataclass(frozen=True, slots=True, kw_only=True)
class Topic:
    """One topic: partitions are fixed because the key decides per-aggregate order."""

    name: str
    partitions: int
    key_field: str
    """Wire name of the payload field whose canonical UUID text is the record key."""
    event_type: str
    contract_version: int
    max_message_bytes: int = _ONE_MIB
    """The topic's `max.message.bytes`: the largest record batch the broker accepts, after
    compression. Set deliberately per topic: the broker's default (about 1 MB) is not a
    decision. Producers set their `message.max.bytes` (checked on the uncompressed record)
    from the largest topic they write."""
    dead_letter_of: str | None = None
    """For a DLQ: the topic whose records it keeps (same key, value and headers)."""

    @classmethod
    def carrying(
        cls,
        event: type[EventStruct],
        name: str,
        *,
        partitions: int = 3,
        max_message_bytes: int = _ONE_MIB,
    ) -> Topic:
        """The topic of ``event``: its type, contract version and key come from the class."""
        return cls(
            name=name,
            partitions=partitions,
            key_field=event.key_wire_name(),
            event_type=event.EVENT_TYPE,
            contract_version=event.CONTRACT_VERSION,
            max_message_bytes=max_message_bytes,
        )

    def dead_letters(self, name: str) -> Topic:
        """The DLQ of this topic: the same records (key, value, headers) and partition count,
        so a dead letter keeps its source partition number."""
        return replace(self, name=name, dead_letter_of=self.name)

    def partition_of(self, key: bytes) -> int:
        """The partition a record of this key belongs on: `key_partition` by the catalogue's
        count, whatever the cluster has."""
        return key_partition(key, self.partitions)

    def config(self) -> dict[str, str]:
        """Topic-level configuration to create the topic with (and to set on a cluster)."""
        return {"max.message.bytes": str(self.max_message_bytes)}


USER_ACCESS_CHANGED = Topic.carrying(
    UserAccessChangedKafkaEvent,
    "pin.identity.access.v1",
    # A full snapshot of a user's active assignments, zstd-compressed on the wire: the limit
    # is the compressed batch's, and the identity relay sends up to twice this uncompressed
    # (sizes and the supported assignments per user: docs/design/identity-fanout.md "Sizes").
    max_message_bytes=8_388_608,
)

AGENT_MEMBERSHIP_CHANGED = Topic.carrying(
    AgentMembershipChanged, "pin.identity.agent-membership-changed.v1"
)

IDENTITY_MEMBERSHIP_DLQ = AGENT_MEMBERSHIP_CHANGED.dead_letters(
    "pin.rewards.identity-membership-dlq.v1"
)

CATALOGUE: tuple[Topic, ...] = (
    USER_ACCESS_CHANGED,
    AGENT_MEMBERSHIP_CHANGED,
    IDENTITY_MEMBERSHIP_DLQ,
)

REWARDS_MEMBERSHIP_CONSUMER_GROUP = "pin-rewards-identity-membership"
