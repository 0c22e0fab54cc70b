"""Uniquely named Kafka topics for tests, created and awaited on the real broker."""

from __future__ import annotations

import time
import uuid

from confluent_kafka.admin import AdminClient, NewTopic


class TopicFactory:
    """Creates topics that no other test shares, and deletes them at the end."""

    def __init__(self, bootstrap: str, *, prefix: str = "pin-test") -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._prefix = prefix
        self._created: list[str] = []

    def create(self, *, partitions: int = 3, name: str | None = None, timeout: float = 30.0) -> str:
        topic = name or f"{self._prefix}.{uuid.uuid4().hex[:12]}"
        futures = self._admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
            operation_timeout=timeout,
        )
        futures[topic].result(timeout=timeout)
        self._created.append(topic)
        self._await_leaders(topic, partitions, timeout)
        return topic

    def _await_leaders(self, topic: str, partitions: int, timeout: float) -> None:
        # CreateTopics answers before every partition has a leader; producing then fails
        # with "unknown topic or partition" for a moment.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            meta = self._admin.list_topics(topic, timeout=timeout).topics.get(topic)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                return
            time.sleep(0.05)
        raise TimeoutError(f"topic {topic} has no leader for every partition after {timeout}s")

    def delete_all(self) -> None:
        if not self._created:
            return
        futures = self._admin.delete_topics(self._created, operation_timeout=10)
        for future in futures.values():
            future.result(timeout=15)
        self._created.clear()
