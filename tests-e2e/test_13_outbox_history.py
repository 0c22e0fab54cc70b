"""Scenario 13: a seeded history of the outbox, checked against its delivery guarantees.

Late writers (one key's writers serialized by a per-key lock, and several writers of one key
at once), a flood of other writers, foreign writers in prepared transactions, and
transactions that hold an id and write nothing, on the real outbox; relays as processes,
with and without pg_read_all_stats, killed, started and stopped so their lanes move; every
commit recorded and the topic read from its start. Then `pin_e2e.history.checks`: nothing
lost and within the bound after the slot's writers, per-key order, aborted rows never
published, the backlog gauges as `outbox status` counts (README "The outbox history").

`make test` runs PIN_HISTORY_SECONDS (40) of load with a new seed; PIN_HISTORY_SEED replays a
plan, PIN_HISTORY_BOUND sets the bound (10 s). A violation fails the scenario with the seed,
the table and the first offending key's history.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest
from pin_e2e.history.plan import schedule
from pin_e2e.history.report import render
from pin_e2e.history.run import run_history
from pin_e2e.report import Recorder
from pin_e2e.stack import Servers
from pin_e2e.system import System

pytestmark = pytest.mark.integration


def _setting(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


SECONDS = _setting("PIN_HISTORY_SECONDS", 40)
BOUND = _setting("PIN_HISTORY_BOUND", 10)


# The run bounds itself (every wait has a deadline); a long one outlasts the suite's 300 s.
@pytest.mark.timeout(int(SECONDS) + 600)
def test_outbox_history(
    make_system: Callable[[str], System],
    e2e_servers: Servers,
    recorder: Recorder,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int(_setting("PIN_HISTORY_SEED", random.SystemRandom().randrange(1, 1_000_000)))
    plan = schedule(seed, SECONDS)
    with recorder.scenario(13, f"outbox history, seed {seed}") as stats:
        system = make_system("s13")
        report = run_history(system, e2e_servers.services.postgres_dsn, plan, bound=BOUND)
        printed = render(report)
        with capsys.disabled():
            print(f"\n{printed}")  # noqa: T201 - the history's table is its output
        stats.faults = [a.describe() for a in plan.actions]
        stats.events = len(report.history.publications)
        stats.notes.append(f"rerun with {report.rerun}")
        violated = report.violated
        stats.lost = 0 if not violated else None
        assert not violated, f"seed {seed}: {[p.name for p in violated]}\n{printed}"
