"""Uniquely named Kafka topics for tests, created and awaited on the real broker."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from pin_runtime.kafka import create_admin, ensure_topics


class TopicFactory:
    """Creates topics that no other test shares, and deletes them at the end."""

    def __init__(self, bootstrap: str, *, prefix: str = "pin-test") -> None:
        self._admin = create_admin(bootstrap, client_id="pin-testkit")
        self._prefix = prefix
        self._created: list[str] = []

    def create(
        self,
        *,
        partitions: int = 3,
        name: str | None = None,
        timeout: float = 30.0,
        config: Mapping[str, str] | None = None,
    ) -> str:
        """A new topic; `config` is its topic-level configuration (e.g. `Topic.config()`)."""
        topic = name or f"{self._prefix}.{uuid.uuid4().hex[:12]}"
        ensure_topics(self._admin, [(topic, partitions, dict(config or {}))], timeout=timeout)
        self._created.append(topic)
        return topic

    def delete_all(self) -> None:
        if not self._created:
            return
        futures = self._admin.delete_topics(self._created, operation_timeout=10)
        for future in futures.values():
            future.result(timeout=15)
        self._created.clear()
