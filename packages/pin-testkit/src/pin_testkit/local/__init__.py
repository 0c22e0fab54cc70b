"""Local PostgreSQL and Kafka servers for tests, without Docker (``pin-local up``).

PostgreSQL runs from the installed server binaries, Kafka from jars Maven copies out of Maven
Central; both keep their data, logs and ports under ``infra/local/.state/``.
"""

from pin_runtime.kafka import TopicSpec
from pin_testkit.local.errors import LocalInfraError, MissingPrerequisiteError
from pin_testkit.local.launcher import (
    LocalServices,
    LocalStatus,
    ServiceStatus,
    down,
    ensure_up,
    status,
)
from pin_testkit.local.topics import catalogue_topics, ensure_topics

__all__ = [
    "LocalInfraError",
    "LocalServices",
    "LocalStatus",
    "MissingPrerequisiteError",
    "ServiceStatus",
    "TopicSpec",
    "catalogue_topics",
    "down",
    "ensure_topics",
    "ensure_up",
    "status",
]
