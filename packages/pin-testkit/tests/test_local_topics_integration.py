"""pin-local's topics follow the catalogue's configuration, on creation and afterwards."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import AdminClient

from pin_testkit.local.topics import ensure_topics

# Not declared to type checkers by confluent-kafka (see pin_testkit.local.topics).
from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]  # isort: skip


def _max_message_bytes(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return str(admin.describe_configs([resource])[resource].result()["max.message.bytes"].value)


def test_existing_topics_get_the_declared_configuration(kafka_bootstrap: str) -> None:
    topic = f"pin-test.{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    try:
        assert ensure_topics(kafka_bootstrap, [(topic, 1, {"max.message.bytes": "2000000"})]) == [
            topic
        ]
        assert _max_message_bytes(kafka_bootstrap, topic) == "2000000"
        # The catalogue changed since: the existing topic follows it.
        assert ensure_topics(kafka_bootstrap, [(topic, 1, {"max.message.bytes": "3000000"})]) == []
        assert _max_message_bytes(kafka_bootstrap, topic) == "3000000"
    finally:
        for future in admin.delete_topics([topic], operation_timeout=10).values():
            future.result(timeout=15)
