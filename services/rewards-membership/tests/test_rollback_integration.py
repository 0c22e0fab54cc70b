"""A rollback to the previous release and forward again (pin_testkit.rollback): the previous
release's `migrate`, run on this release's schema, takes no privilege the consumer and the
operator's commands need; this release's `migrate` then grants exactly its declaration; and
it refuses a schema newer than it knows."""

from __future__ import annotations

from pathlib import Path

import pytest

from pin_testkit.releases import ServiceRelease
from pin_testkit.rollback import RollbackChecks
from rewards_membership.app import SCHEMA
from rewards_membership.db_roles import RUNTIME_ROLES

pytestmark = pytest.mark.integration


class TestRollback(RollbackChecks):
    SERVICE = ServiceRelease.of(Path(__file__).resolve().parents[1])
    SCHEMA = SCHEMA
    ROLES = RUNTIME_ROLES

    @pytest.fixture
    def migrated(self, database: str) -> str:
        return database
