"""The rhythm of the relay's rounds: when it looks at the lanes again, and how a round ends.

A round starts with the connection and, every `lock_retry_interval` (or when forced), a
look at the lanes (rebalance); it ends with the pump's tally taken, the backlog gauges
refreshed when due (at each look, after a quarantine, when idle), the pause for a refusal
of the cluster decided (`relay_pause.next_pause`) and reported on a change, readiness set
from the round's outcome and the result kept as `last_round`.
"""

from __future__ import annotations

import time
from dataclasses import KW_ONLY, dataclass, field

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.outbox.metrics import RelayMetrics
from identity_fanout.outbox.pause import Pause, next_pause
from identity_fanout.outbox.pump import Pump, RoundResult
from identity_fanout.outbox.report import refresh_gauges, report_pause
from identity_fanout.outbox.session import LaneSession
from pin_runtime.http import ComponentState

__all__ = ["Rounds"]


@dataclass(eq=False)
class Rounds:
    session: LaneSession
    pump: Pump
    metrics: RelayMetrics
    state: ComponentState
    _: KW_ONLY
    look_interval: float
    _next_look: float = field(init=False, default=0.0)
    _gauges_due: bool = field(init=False, default=False)
    last_round: RoundResult | None = field(init=False, default=None)
    pause: Pause | None = field(init=False, default=None)
    """The refusal of the cluster the relay waits out now (None: not paused)."""

    def start(self, *, force: bool) -> psycopg.Connection[TupleRow]:
        """The connection; every `look_interval` (or if forced) also the lanes and gauges."""
        conn = self.session.connection()
        now = time.monotonic()
        if force or now >= self._next_look:
            self._next_look = now + self.look_interval
            self.session.rebalance()
            self._gauges_due = True
        return conn

    def finish(self, conn: psycopg.Connection[TupleRow]) -> RoundResult:
        idle = not self.pump.tally.read and not len(self.pump.window)
        if idle:
            self.pump.flush()  # nothing else to do: the last deletes, then the gauges
        result = self.pump.take_tally()
        # After the step (the backlog it left): at each look, on a quarantine, when idle.
        if self._gauges_due or result.quarantined or idle:
            self._gauges_due = False
            refresh_gauges(conn, self.metrics)
        result.active = bool(self.session.lanes)
        before, self.pause = (
            self.pause,
            next_pause(self.pause, result.refused, acknowledged=result.acknowledged, idle=idle),
        )
        report_pause(self.metrics, before, self.pause)
        if self.pause is not None:
            self.state.degraded(f"kafka: {self.pause.describe()}")
        elif result.error is None:
            self.state.ok()
        else:
            self.state.degraded(f"kafka: {result.error}")
        self.last_round = result
        return result
