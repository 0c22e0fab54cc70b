"""Creating the topics of the catalogue on the local broker."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaException

# confluent-kafka exports these from confluent_kafka.admin without declaring it to type
# checkers (no __all__, no stub re-export).
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from pin_contracts.topics import CATALOGUE
from pin_runtime.errors import KafkaSetupError
from pin_runtime.kafka import TopicSpec, create_admin
from pin_runtime.kafka import ensure_topics as create_missing_topics
from pin_testkit.local.errors import LocalInfraError


def catalogue_topics() -> list[TopicSpec]:
    """The topics of ``pin_contracts.topics.CATALOGUE`` as (name, partitions, config)."""
    return [(topic.name, topic.partitions, topic.config()) for topic in CATALOGUE]


def ensure_topics(bootstrap: str, topics: Sequence[TopicSpec], timeout: float = 60.0) -> list[str]:
    """Create the missing ``topics`` (replication factor 1) and wait for their leaders.

    Topics that exist already get their declared configuration set: a local broker whose
    state predates a change of the catalogue (a new ``max.message.bytes``) follows it, as
    an operator would apply it to a cluster.
    """
    admin = create_admin(bootstrap, client_id="pin-local")
    try:
        created = create_missing_topics(admin, topics, timeout=timeout)
        _apply_configs(admin, [spec for spec in topics if spec[0] not in created], timeout)
    except (KafkaSetupError, KafkaException) as exc:
        raise LocalInfraError(f"cannot create topics on {bootstrap}: {exc}") from exc
    return created


def _apply_configs(admin: AdminClient, topics: Sequence[TopicSpec], timeout: float) -> None:
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            spec[0],
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                for name, value in spec[2].items()
            ],
        )
        for spec in topics
        if len(spec) == 3 and spec[2]  # noqa: PLR2004 - (name, partitions, config)
    ]
    if not resources:
        return
    for future in admin.incremental_alter_configs(resources, request_timeout=timeout).values():
        future.result(timeout=timeout)
