"""`rewards-membership agent show`: the projection of one agent, its rows and the display
status derived from them (a table, or one JSON object)."""

from __future__ import annotations

import uuid

from rich.console import Console

from pin_runtime.listing import Listing
from rewards_membership.ops.tool import connect_tool, write_json
from rewards_membership.rules.display import display_status
from rewards_membership.settings import Settings
from rewards_membership.store import fetch_agent_rows

__all__ = ["agent_show"]

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


def agent_show(settings: Settings, agent_user_id: uuid.UUID, *, as_json: bool = False) -> int:
    with connect_tool(settings) as conn:
        rows = fetch_agent_rows(conn, agent_user_id)
    status = display_status((r.company_id, r.membership_status) for r in rows)
    if as_json:
        write_json({"agent_user_id": agent_user_id, "display_status": status, "rows": rows})
        return 0
    values = [
        tuple("" if v is None else str(v) for v in (getattr(row, c) for c in _AGENT_COLUMNS))
        for row in rows
    ]
    Console().print(Listing(_AGENT_COLUMNS, values, title=f"agent {agent_user_id}: {status}"))
    return 0
