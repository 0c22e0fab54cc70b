"""The rhythm of the relay's rounds: when it looks at the lanes again, and how a round ends.

A round starts with the connection and, every `lock_retry_interval` (or when forced), a
look at the lanes (rebalance); it ends with the pump's tally taken, the backlog gauges
refreshed when due (at each look, after a quarantine, when idle), readiness set from the
round's outcome and the result kept as `last_round`.
"""

from __future__ import annotations

import time

import psycopg
from psycopg.rows import TupleRow

from identity_fanout.relay_metrics import RelayMetrics
from identity_fanout.relay_pump import Pump, RoundResult
from identity_fanout.relay_report import refresh_gauges
from identity_fanout.relay_session import LaneSession
from pin_runtime.http import ComponentState

__all__ = ["Rounds"]


class Rounds:
    def __init__(
        self,
        session: LaneSession,
        pump: Pump,
        metrics: RelayMetrics,
        state: ComponentState,
        *,
        look_interval: float,
    ) -> None:
        self._session = session
        self._pump = pump
        self._metrics = metrics
        self._state = state
        self._look_interval = look_interval
        self._next_look = 0.0
        self._gauges_due = False
        self.last_round: RoundResult | None = None

    def start(self, *, force: bool) -> psycopg.Connection[TupleRow]:
        """The connection; every `look_interval` (or if forced) also the lanes and gauges."""
        conn = self._session.connection()
        now = time.monotonic()
        if force or now >= self._next_look:
            self._next_look = now + self._look_interval
            self._session.rebalance()
            self._gauges_due = True
        return conn

    def finish(self, conn: psycopg.Connection[TupleRow]) -> RoundResult:
        idle = not self._pump.tally.read and not len(self._pump.window)
        if idle:
            self._pump.flush()  # nothing else to do: the last deletes, then the gauges
        tally = self._pump.take_tally()
        # After the step (the backlog it left): at each look, on a quarantine, when idle.
        if self._gauges_due or tally.quarantined or idle:
            self._gauges_due = False
            refresh_gauges(conn, self._metrics)
        result = tally.result(active=bool(self._session.lanes))
        if result.error is None:
            self._state.ok()
        else:
            self._state.degraded(f"kafka: {result.error}")
        self.last_round = result
        return result
