"""The campaign's tables: invariants, faults with their timeline, alerts during faults."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from pin_e2e.chaos.campaign import CampaignReport

__all__ = ["render"]


def _invariants(report: CampaignReport) -> Table:
    table = Table(title=f"chaos campaign, seed {report.seed}: invariants", title_justify="left")
    table.add_column("invariant", overflow="fold")
    table.add_column("holds")
    table.add_column("figures", overflow="fold")
    for invariant in report.invariants:
        table.add_row(invariant.name, "yes" if invariant.holds else "NO", invariant.detail)
    return table


def _alerts(report: CampaignReport) -> Table:
    table = Table(title="alerts fired (during which faults)", title_justify="left")
    table.add_column("alert")
    table.add_column("during", overflow="fold")
    table.add_column("firing at the end")
    for alert, during in sorted(report.alerts.items()):
        table.add_row(
            alert, ", ".join(sorted(during)), "yes" if alert in report.firing_at_end else "no"
        )
    return table


def render(report: CampaignReport, width: int = 160) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(_invariants(report))
    console.print(_alerts(report))
    console.print(
        f"{len(report.faults)} faults, {report.role_changes} role changes, "
        f"{report.membership_changes} membership changes, {report.access_events:,} access "
        f"events; converged {report.converged_after:.1f}s after the faults",
        markup=False,
        highlight=False,
    )
    console.print("timeline:", markup=False)
    for at, what in report.timeline:
        console.print(f"  {at:7.1f}s  {what}", markup=False, highlight=False)
    return console.export_text()
