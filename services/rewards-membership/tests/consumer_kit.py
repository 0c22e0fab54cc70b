"""What a consumer test on its own topics uses, as one value: the ``kit`` fixture.

Imported by the test modules (``conftest`` puts this directory on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pin_contracts import AgentMembershipChanged
from rewards_membership.settings import Settings

__all__ = ["ConsumerKit"]


@dataclass(frozen=True)
class ConsumerKit:
    """The broker, new topics, the consumer in a thread (``start_consumer``), payloads, raw
    values, SQL on the test's database, the consumer's settings and waiting."""

    kafka_bootstrap: str
    kafka_topic: Callable[..., str]
    start_consumer: Callable[..., Any]
    event: Callable[..., AgentMembershipChanged]
    raw: Callable[..., bytes]
    sql: Callable[..., list[tuple[Any, ...]]]
    settings: Settings
    wait: Callable[..., float]
