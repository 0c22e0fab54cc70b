"""Scenario 10: a chaos campaign, a seeded random schedule of faults on the running system.

`make test` runs a short campaign (PIN_CHAOS_FAULTS, by default one fault of each short
kind, 12, over PIN_CHAOS_SPAN seconds); `make chaos` a long one (50 faults and more, then the
long faults with PIN_CHAOS_LONG=1: every relay down, every consumer down, every worker batch
failing, a 10-minute partial outage, each checked against the alerts it must raise). PIN_CHAOS_SEED
replays a schedule; without it a new seed is drawn and printed. Any violated invariant
fails the scenario with the seed and the timeline.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from pin_e2e.chaos.campaign import run_campaign
from pin_e2e.chaos.faults import SHORT_FAULTS
from pin_e2e.chaos.report import render
from pin_e2e.report import Recorder

from pin_testkit.private_servers import PrivateServers

pytestmark = pytest.mark.integration


def _setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


# Every short kind in every run (the schedule draws each once before drawing again).
FAULTS = _setting("PIN_CHAOS_FAULTS", len(SHORT_FAULTS))
SPAN = _setting("PIN_CHAOS_SPAN", 6 * FAULTS)
LONG = bool(_setting("PIN_CHAOS_LONG", 0))
LONG_SECONDS = 4200 if LONG else 0
"""The long faults, their gaps and the alerts' resolution after them (about 62 minutes)."""


# The campaign bounds itself (every wait has a deadline); the suite's 300 s per test would
# cut a long one short.
@pytest.mark.timeout(SPAN + LONG_SECONDS + 1800)
def test_chaos_campaign(
    e2e_servers: PrivateServers,
    recorder: Recorder,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = _setting("PIN_CHAOS_SEED", random.SystemRandom().randrange(1, 1_000_000))
    faults, span = FAULTS, SPAN
    with recorder.scenario(10, f"chaos campaign, seed {seed}") as stats:
        report = run_campaign(e2e_servers, tmp_path, seed=seed, faults=faults, span=span, long=LONG)
        printed = render(report)
        with capsys.disabled():
            print(f"\n{printed}")  # noqa: T201 - the campaign's table is its output
        stats.faults = [f.describe() for f in report.faults]
        stats.events = report.access_events
        stats.notes.append(
            f"rerun with PIN_CHAOS_SEED={seed} PIN_CHAOS_FAULTS={faults} PIN_CHAOS_LONG={int(LONG)}"
        )
        violated = report.violated
        stats.lost = 0 if not violated else None
        assert not violated, f"seed {seed}: {[v.name for v in violated]}\n{printed}"
