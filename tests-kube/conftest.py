"""The scenarios on the cluster (``make e2e-kube``): both releases installed by
``infra/kube/e2e.sh`` before pytest starts, checked as the compose topology checks them
(tests-e2e/pin_e2e), through the databases, the topics and the ops pods' commands."""

from __future__ import annotations

import pytest
from pin_kube import IDENTITY, REWARDS, wait_rolled_out


@pytest.fixture(autouse=True)
def releases_settled() -> None:
    """Every scenario starts with both releases rolled out (the one before may have killed
    or moved pods)."""
    wait_rolled_out(IDENTITY)
    wait_rolled_out(REWARDS)
