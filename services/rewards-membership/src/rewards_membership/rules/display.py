"""The agent's display status, derived on read from all its rows (never stored)."""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from pin_contracts import AgentMembershipStatus

__all__ = ["display_status"]


def display_status(rows: Iterable[tuple[UUID, str | None]]) -> str:
    """`independent`, or `in agency <CompanyId>` (several: every active one, sorted).

    Multi-membership (ADR-0070): any Active row makes the agent InAgency.
    """
    active = sorted(
        str(company) for company, status in rows if status == AgentMembershipStatus.ACTIVE
    )
    if not active:
        return "independent"
    if len(active) == 1:
        return f"in agency {active[0]}"
    return f"in agencies {', '.join(active)}"
