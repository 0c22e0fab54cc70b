"""`rewards-membership agent show`: the projection of one agent, its rows and the display
status derived from them (a table, or one JSON object).

An agent the projection has no row of is not found: exit 1, one line on stderr, and with
`--json` the object says so (`"found": false`, `"display_status": null`, no rows). It is not
`independent`: that is what an agent's rows say when none is Active, and no row says
nothing (no event of the agent was ever applied, or the id is mistyped)."""

from __future__ import annotations

import uuid

import msgspec
from rich.console import Console

from pin_runtime.composition import ERROR_EXIT_CODE, error_line
from pin_runtime.listing import Listing
from rewards_membership.ops.tool import cell, connect_tool, write_json
from rewards_membership.rules.display import display_status
from rewards_membership.settings import Settings
from rewards_membership.store import AgentRow, fetch_agent_rows

__all__ = ["AgentShown", "agent_show"]

_AGENT_COLUMNS = (
    "company_id",
    "membership_status",
    "leave_reason",
    "left_at",
    "effective_at",
    "first_activity_at",
    "last_activity_at",
    "last_membership_version",
    "version",
    "deals_closed_count",
    "fixations_count",
    "commission_accrued_amount",
    "commission_paid_amount",
)


class AgentShown(msgspec.Struct, frozen=True, kw_only=True):
    """What `agent show --json` prints."""

    agent_user_id: uuid.UUID
    found: bool
    """False: the projection has no row of the agent (exit 1)."""
    display_status: str | None
    """`independent`, `in agency <id>`, ...; None when not found."""
    rows: list[AgentRow]


def agent_show(settings: Settings, agent_user_id: uuid.UUID, *, as_json: bool = False) -> int:
    with connect_tool(settings) as conn:
        rows = fetch_agent_rows(conn, agent_user_id)
    status = display_status((r.company_id, r.membership_status) for r in rows) if rows else None
    if as_json:
        write_json(
            AgentShown(
                agent_user_id=agent_user_id, found=bool(rows), display_status=status, rows=rows
            )
        )
    if status is None:
        error_line(f"error: agent {agent_user_id} not found: the projection has no row of it")
        return ERROR_EXIT_CODE
    if as_json:
        return 0
    values = [tuple(cell(getattr(row, c)) for c in _AGENT_COLUMNS) for row in rows]
    Console().print(Listing(_AGENT_COLUMNS, values, title=f"agent {agent_user_id}: {status}"))
    return 0
