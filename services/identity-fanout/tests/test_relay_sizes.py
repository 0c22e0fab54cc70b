"""The relay's size settings follow the topic catalogue (no broker needed)."""

from __future__ import annotations

from identity_fanout.outbox.publisher import BATCH_SIZE_BYTES
from identity_fanout.outbox.relay import COMPRESSION
from identity_fanout.outbox.settings import RELAY_MESSAGE_MAX_BYTES
from pin_contracts import AGENT_MEMBERSHIP_CHANGED, USER_ACCESS_CHANGED


def test_the_producer_limit_is_twice_the_access_topic_limit_with_zstd() -> None:
    # zstd shrinks an access snapshot far below half (design notes "Sizes"): whatever
    # produce() accepts fits the topic.
    assert RELAY_MESSAGE_MAX_BYTES == 2 * USER_ACCESS_CHANGED.max_message_bytes == 16 * 1024**2
    assert COMPRESSION == "zstd"


def test_a_shared_batch_fits_every_topic_the_relay_writes() -> None:
    # Otherwise the broker could refuse small records together with a large one.
    topics = (USER_ACCESS_CHANGED, AGENT_MEMBERSHIP_CHANGED)
    assert min(topic.max_message_bytes for topic in topics) > BATCH_SIZE_BYTES
