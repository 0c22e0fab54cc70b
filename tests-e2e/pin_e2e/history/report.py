"""The history run's report: every property with its figures, the first offending key's
history for each violated one, the plan's faults and the timeline."""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from pin_e2e.history.checks import Property, key_history
from pin_e2e.history.model import History
from pin_e2e.history.plan import Plan

__all__ = ["HistoryReport", "render"]


@dataclass
class HistoryReport:
    plan: Plan
    bound: float
    history: History
    properties: list[Property]
    seconds: float
    """Wall time of the whole run."""
    rerun: str
    """How to play the same plan again."""
    recorded: str | None = None
    """Where the history was kept (`model.from_json` reads it)."""

    @property
    def violated(self) -> list[Property]:
        return [p for p in self.properties if p.holds is False]


def _table(report: HistoryReport) -> Table:
    table = Table(
        title=f"outbox history, seed {report.plan.seed}, {report.plan.seconds:g}s of load",
        title_justify="left",
    )
    table.add_column("property", overflow="fold")
    table.add_column("holds")
    table.add_column("figures", overflow="fold")
    for prop in report.properties:
        holds = "n/a" if prop.holds is None else "yes" if prop.holds else "NO"
        table.add_row(prop.name, holds, prop.figures)
    return table


def render(report: HistoryReport, width: int = 160) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(_table(report))

    def line(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    for prop in report.violated:
        if prop.offender is None:
            continue
        key, row = prop.offender
        line(f"{prop.name}: first offending key, row id {row}")
        for text in key_history(report.history, key, focus=row):
            line(f"  {text}")
    line(f"faults planned ({len(report.plan.actions)}):")
    for action in report.plan.actions:
        line(f"  {action.at:7.2f}s  {action.describe()}")
    line("timeline:")
    t0 = report.history.started
    for at, what in sorted(report.history.events):
        line(f"  {at - t0:7.2f}s  {what}")
    line(f"{report.seconds:.1f}s in all; {report.rerun}")
    if report.recorded:
        line(f"the history: {report.recorded} (pin_e2e.history.model.from_json)")
    return console.export_text()
