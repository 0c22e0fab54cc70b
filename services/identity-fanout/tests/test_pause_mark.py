"""A relay's pause in its session's application_name: written within the server's 63 bytes,
read back whatever the reason."""

from __future__ import annotations

import pytest

from identity_fanout.outbox.pause_mark import (
    NAME_LIMIT,
    PauseMark,
    base_name,
    pause_of,
    session_name,
)

BASE = "identity-fanout-relay@relay-7d9f8b6c5-x2x9z"


def test_not_paused_is_the_name_itself() -> None:
    assert session_name(BASE, None) == BASE
    assert pause_of(BASE) is None
    assert base_name(BASE) == BASE


def test_reason_and_topic_when_they_fit() -> None:
    name = session_name("identity-fanout-relay@h", "unknown-topic", "pin.access.v1")
    assert name == "identity-fanout-relay@h paused:unknown-topic pin.access.v1"
    assert pause_of(name) == PauseMark(reason="unknown-topic", topic="pin.access.v1")
    assert base_name(name) == "identity-fanout-relay@h"


@pytest.mark.parametrize(
    "reason", ["unknown-topic", "topic-authorization", "cluster-authorization", "partition-count"]
)
def test_a_long_name_keeps_the_reason_and_drops_a_topic_that_does_not_fit(reason: str) -> None:
    name = session_name(BASE * 2, reason, "pin.identity.agent-membership-changed.v1")
    assert len(name) <= NAME_LIMIT
    assert pause_of(name) == PauseMark(reason=reason, topic=None)
    assert BASE.startswith(base_name(name) or "-")


def test_a_name_that_is_no_relays_carries_no_pause() -> None:
    assert pause_of(None) is None
    assert pause_of("psql") is None
    assert pause_of("paused:unknown-topic") is None  # no base: not a relay's mark
