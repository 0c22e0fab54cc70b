"""The summary the suite prints: per scenario, events, faults injected, lost, duplicates."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

__all__ = ["Recorder", "ScenarioStats"]


@dataclass
class ScenarioStats:
    number: int
    title: str
    events: int = 0
    faults: list[str] = field(default_factory=list)
    lost: int | None = None
    duplicates: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    outcome: str = "running"
    started: float = field(default_factory=time.monotonic)
    phases: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, phase: str) -> None:
        """Note when ``phase`` ended (seconds into the scenario), for the timing lines."""
        self.phases.append((phase, time.monotonic() - self.started))

    def fault(self, description: str) -> None:
        self.faults.append(description)

    def duplicate(self, kind: str, count: int) -> None:
        self.duplicates[kind] = self.duplicates.get(kind, 0) + count


@dataclass
class Recorder:
    scenarios: list[ScenarioStats] = field(default_factory=list)

    @contextmanager
    def scenario(self, number: int, title: str) -> Iterator[ScenarioStats]:
        stats = ScenarioStats(number, title)
        self.scenarios.append(stats)
        try:
            yield stats
        except BaseException:
            stats.outcome = "FAILED"
            raise
        else:
            stats.outcome = "passed"
        finally:
            stats.seconds = time.monotonic() - stats.started

    def table(self) -> Table:
        table = Table(title="end-to-end scenarios", title_justify="left")
        for column, justify in (
            ("#", "right"),
            ("scenario", "left"),
            ("result", "left"),
            ("events", "right"),
            ("faults injected", "left"),
            ("lost", "right"),
            ("duplicates found", "left"),
            ("time", "right"),
        ):
            table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for s in sorted(self.scenarios, key=lambda s: s.number):
            found = [f"{n} {kind}" for kind, n in s.duplicates.items() if n]
            duplicates = ", ".join(found) or "0"
            table.add_row(
                str(s.number),
                s.title,
                s.outcome,
                f"{s.events:,}",
                "; ".join(s.faults) or "-",
                "?" if s.lost is None else str(s.lost),
                duplicates,
                f"{s.seconds:.1f}s",
            )
        total_events = sum(s.events for s in self.scenarios)
        total_faults = sum(len(s.faults) for s in self.scenarios)
        total_lost = sum(s.lost or 0 for s in self.scenarios)
        total_duplicates = sum(sum(s.duplicates.values()) for s in self.scenarios)
        table.add_section()
        table.add_row(
            "",
            f"{len(self.scenarios)} scenarios",
            f"{sum(s.outcome == 'passed' for s in self.scenarios)} passed",
            f"{total_events:,}",
            f"{total_faults} faults",
            str(total_lost),
            str(total_duplicates),
            f"{sum(s.seconds for s in self.scenarios):.1f}s",
        )
        return table

    def render(self, width: int = 160) -> str:
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(self.table())
        for s in self.scenarios:
            for note in s.notes:
                console.print(f"  {s.number}. {note}", markup=False, highlight=False)
            if s.phases:
                timeline = ", ".join(f"{name} {at:.1f}s" for name, at in s.phases)
                console.print(f"  {s.number}. timeline: {timeline}", markup=False, highlight=False)
        return console.export_text()
