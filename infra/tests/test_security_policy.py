"""SECURITY.md at the repository's root: a private way to report, the supported versions,
what the services trust and what they do not; the roles, topics and group it names exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from identity_fanout.db_roles import RUNTIME_ROLES as IDENTITY_ROLES
from pin_contracts import CATALOGUE, REWARDS_MEMBERSHIP_CONSUMER_GROUP
from rewards_membership.db_roles import RUNTIME_ROLES as REWARDS_ROLES

ROOT = Path(__file__).resolve().parents[2]
POLICY = (ROOT / "SECURITY.md").read_text(encoding="utf-8")


def section(heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(?P<body>.*?)(?=^## |\Z)", POLICY, re.M | re.S)
    assert match is not None, f"SECURITY.md has no section {heading!r}"
    return match["body"]


def test_a_vulnerability_is_reported_privately() -> None:
    body = section("Reporting a vulnerability")
    assert "private vulnerability reporting" in body.lower()
    assert re.search(r"`security@[^`\s]+`", body)
    assert "never in a public issue" in body


def test_the_supported_versions_name_every_shipped_component() -> None:
    body = section("Supported versions")
    for component in ("identity-fanout", "rewards-membership", "pin-contracts", "Helm charts"):
        assert re.search(rf"^\| {re.escape(component)} \|", body, re.M), component


@pytest.mark.parametrize(
    "subject",
    [
        "PostgreSQL and its roles",
        "The outbox and its quarantine",
        "The operator commands' database login",
        "Kafka principals and ACLs",
        "The DLQ",
        "Headers taken from input",
        "Secrets from the environment or files",
    ],
)
def test_each_trusted_dependency_says_what_it_is_trusted_for(subject: str) -> None:
    assert re.search(
        rf"^- \*\*{re.escape(subject)}\.\*\*", section("What the services trust"), re.M
    )


def test_it_says_what_is_not_trusted_and_not_defended_against() -> None:
    body = section("What they do not trust, and what they do not defend against")
    assert "Not trusted:" in body
    assert "Not defended against:" in body


def test_the_roles_topics_and_group_it_names_exist() -> None:
    roles = {role.name for role in (*IDENTITY_ROLES, *REWARDS_ROLES)}
    named = set(re.findall(r"`((?:identity|rewards)_[a-z]+_[a-z_]+)`", POLICY))
    assert named, "no runtime role named"
    assert named <= roles, named - roles
    topics = set(re.findall(r"`(pin\.[a-z.-]+\.v\d+)`", POLICY))
    assert topics, "no topic named"
    assert topics <= {topic.name for topic in CATALOGUE}
    assert f"`{REWARDS_MEMBERSHIP_CONSUMER_GROUP}`" in POLICY
