"""Creating the topics of the catalogue on the local broker."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaException

from pin_contracts.topics import CATALOGUE
from pin_runtime.errors import KafkaSetupError
from pin_runtime.kafka import TopicSpec, create_admin
from pin_runtime.kafka import ensure_topics as create_missing_topics
from pin_testkit.local.errors import LocalInfraError


def catalogue_topics() -> list[TopicSpec]:
    """The topics of ``pin_contracts.topics.CATALOGUE`` as (name, partitions, config)."""
    return [(topic.name, topic.partitions, topic.config()) for topic in CATALOGUE]


def ensure_topics(bootstrap: str, topics: Sequence[TopicSpec], timeout: float = 60.0) -> list[str]:
    """Create the missing ``topics`` (replication factor 1) and wait for their leaders."""
    admin = create_admin(bootstrap, client_id="pin-local")
    try:
        return create_missing_topics(admin, topics, timeout=timeout)
    except (KafkaSetupError, KafkaException) as exc:
        raise LocalInfraError(f"cannot create topics on {bootstrap}: {exc}") from exc
