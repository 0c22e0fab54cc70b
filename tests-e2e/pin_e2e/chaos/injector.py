"""Applying one scheduled fault to the running system, and healing it.

`inject(fault)` starts the fault and returns what heals it (called when its duration is
over; a process fault heals at once: the process is started again, as its Deployment
would). Server faults use the servers' own controls: the private broker's SIGKILL/SIGTERM,
`pg_ctl stop -m fast|immediate`; a lock on hot rows is a transaction of the campaign's
holding `FOR UPDATE` on every fan-out task and every projection row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import psycopg

from pin_e2e.chaos.faults import NETWORK_FAULTS, PROCESS_FAULTS, Fault, FaultKind
from pin_e2e.chaos.topology import ChaosSystem
from pin_testkit.local.toxiproxy import Stream

__all__ = ["Heal", "inject"]

Heal = Callable[[], None]
_LOCK_WAIT = "2s"
"""How long a lock fault waits for its rows before giving up this time."""


def _nothing() -> None:
    return None


def inject(system: ChaosSystem, fault: Fault) -> Heal:
    """Start `fault`; the callable that ends it."""
    if fault.kind in PROCESS_FAULTS:
        return _process_fault(system, fault)
    if fault.kind in NETWORK_FAULTS:
        return _network_fault(system, fault)
    return _server_fault(system, fault.kind)


def _process_fault(system: ChaosSystem, fault: Fault) -> Heal:
    process = system.members[fault.target].process
    if process.running():
        if fault.kind is FaultKind.SIGKILL:
            process.kill()
        else:
            process.terminate()
    process.start()
    return _nothing


def _server_fault(system: ChaosSystem, kind: FaultKind) -> Heal:
    if kind is FaultKind.BROKER_SIGKILL:
        system.broker.kill()
        return lambda: _start_broker(system)
    if kind is FaultKind.BROKER_SIGTERM:
        system.broker.stop()
        return lambda: _start_broker(system)
    if kind is FaultKind.HOT_ROW_LOCK:
        return _hold_hot_rows(system)
    if system.postgres_down:
        return _nothing  # overlaps a restart still under way: that one heals both
    mode = "fast" if kind is FaultKind.POSTGRES_RESTART_FAST else "immediate"
    system.servers.stop_postgres(mode=mode)
    system.postgres_down = True
    return lambda: _start_postgres(system)


def _network_fault(system: ChaosSystem, fault: Fault) -> Heal:
    member = system.members[fault.target]
    proxy = member.postgres if fault.dependency == "postgres" else member.kafka
    assert proxy is not None, fault
    if fault.kind is FaultKind.PARTITION:
        proxy.disable()
        return proxy.enable
    toxics: dict[FaultKind, tuple[str, Stream, dict[str, int]]] = {
        FaultKind.LATENCY: ("latency", "downstream", {"latency": 500, "jitter": 250}),
        # Data stops flowing; connections stay open (a half-dead peer).
        FaultKind.STALL: ("timeout", "downstream", {"timeout": 0}),
        # Every connection of that path is reset (open ones and new ones while it lasts).
        FaultKind.RESET: ("reset_peer", "upstream", {"timeout": 0}),
    }
    kind, stream, attributes = toxics[fault.kind]
    name = proxy.add_toxic(kind, stream=stream, **attributes)
    return lambda: proxy.remove_toxic(name)


def _start_postgres(system: ChaosSystem) -> None:
    system.servers.restart_stopped()
    system.postgres_down = False


def _start_broker(system: ChaosSystem) -> None:
    system.broker.start()


def _hold_hot_rows(system: ChaosSystem) -> Heal:
    """Row locks on the rows the services update most, held until healed."""
    held: list[psycopg.Connection[tuple[object, ...]]] = []

    def release() -> None:
        for conn in held:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
            with contextlib.suppress(psycopg.Error):
                conn.close()  # closes even when the rollback failed (its locks go with it)

    if system.postgres_down:
        return _nothing  # nothing to lock while the server restarts
    try:
        for dsn, statement in (
            (system.base.identity_dsn, "SELECT 1 FROM identity.access_fanout_tasks FOR UPDATE"),
            (system.base.identity_dsn, "SELECT 1 FROM identity.access_fanout_shards FOR UPDATE"),
            (system.base.rewards_dsn, "SELECT 1 FROM rewards.agent_performance FOR UPDATE"),
        ):
            # Never wait for the rows: the schedule is played on one thread, so a lock fault
            # waiting for an earlier one's rows would keep that one from ever being healed.
            conn = psycopg.connect(dsn, connect_timeout=5, options=f"-c lock_timeout={_LOCK_WAIT}")
            held.append(conn)
            conn.execute(statement)
    except psycopg.OperationalError:
        # The server is recovering from a restart, or the rows are locked already (an
        # overlapping lock fault, a batch of the services): no lock this time.
        release()
        return _nothing
    return release
