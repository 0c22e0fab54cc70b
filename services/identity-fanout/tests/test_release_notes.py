"""The release rule of identity-fanout (`pin_testkit.releases.ReleaseRuleChecks`): the version in
pyproject.toml has a changelog entry, the chart ships it, the previous release is recorded in
UPGRADING.md on a commit of main, and every migration added since that release is expand-only unless
UPGRADING.md lists it as a contract migration."""

from __future__ import annotations

from pathlib import Path

from pin_testkit.releases import ReleaseRuleChecks, ServiceRelease


class TestReleaseRule(ReleaseRuleChecks):
    SERVICE = ServiceRelease.of(Path(__file__).resolve().parents[1])
