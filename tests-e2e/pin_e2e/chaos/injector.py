"""Applying one scheduled fault to the running system, and healing it.

`inject(fault)` starts the fault and returns what heals it (called when its duration is
over; a process fault heals at once: the process is started again, as its Deployment
would). Server faults use the servers' own controls: the private broker's SIGKILL/SIGTERM,
`pg_ctl stop -m fast|immediate`; a lock on hot rows is a transaction of the campaign's
holding `FOR UPDATE` on every fan-out task and every projection row.

The long faults stop a whole kind of process (every relay, every consumer) until healed,
take the workers' privilege on `identity.role_assignments` away (every worker batch fails
while the platform's role changes go on), or flap every worker's path to PostgreSQL (down
10 s, up 10 s) while they last.

A held snapshot is a session of the campaign's that opened a REPEATABLE READ transaction on
a service's database, read once and went idle in it (a console left open): it holds the
database's xmin horizon until healed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final

import psycopg
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.cimpl import NewPartitions

from pin_contracts import AGENT_MEMBERSHIP_CHANGED, USER_ACCESS_CHANGED
from pin_e2e.chaos.faults import (
    GROWN_PARTITIONS,
    LONG_FAULTS,
    NETWORK_FAULTS,
    PROCESS_FAULTS,
    TOPIC_FAULTS,
    Fault,
    FaultKind,
)
from pin_e2e.chaos.topology import CONSUMERS, RELAYS, WORKERS, ChaosSystem
from pin_runtime.kafka import create_admin
from pin_testkit.local.toxiproxy import Stream

__all__ = ["Heal", "inject"]

Heal = Callable[[], None]
_LOCK_WAIT = "2s"
"""How long a lock fault waits for its rows before giving up this time."""


FLAP_SECONDS: Final = 10.0
"""The partial outage: each worker's path to PostgreSQL is down this long, then up as long."""
LOCK_ACQUIRE_DEADLINE: Final = 60.0
"""How long a long fault's own statement may keep failing (the server restarting)."""


def _nothing() -> None:
    return None


def inject(system: ChaosSystem, fault: Fault) -> Heal:
    """Start `fault`; the callable that ends it."""
    if fault.kind in PROCESS_FAULTS:
        return _process_fault(system, fault)
    if fault.kind in NETWORK_FAULTS:
        return _network_fault(system, fault)
    if fault.kind in LONG_FAULTS:
        return _long_fault(system, fault.kind)
    if fault.kind in TOPIC_FAULTS:
        return _partitions_added(system)
    if fault.kind is FaultKind.HELD_SNAPSHOT:
        return _held_snapshot(system, fault.target)
    return _server_fault(system, fault.kind)


def _held_snapshot(system: ChaosSystem, database: str) -> Heal:
    """A snapshot held on `database` (identity or rewards) until healed."""
    dsn = system.base.identity_dsn if database == "identity" else system.base.rewards_dsn
    conn = psycopg.connect(dsn, connect_timeout=5, application_name="chaos-held-snapshot")
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT 1")

    def heal() -> None:
        with contextlib.suppress(psycopg.Error):  # a restart may have ended it already
            conn.rollback()
        conn.close()

    return heal


def _partitions_added(system: ChaosSystem) -> Heal:
    """Both identity topics grown from 3 to `GROWN_PARTITIONS` partitions, as an operator's
    `kafka-topics --alter` would while everything runs. A broker fault may overlap, and its
    heal comes from the same schedule: the request is retried on a thread of its own, so the
    schedule goes on (and brings the broker back) meanwhile. Partitions only grow: the heal
    only checks that the growth took."""
    refused: list[str] = []
    grower = threading.Thread(
        target=_grow, args=(system.bootstrap, refused), name="chaos-partitions", daemon=True
    )
    grower.start()

    def heal() -> None:
        grower.join(GROW_DEADLINE)
        if grower.is_alive() or refused:
            raise AssertionError(f"partitions not added within {GROW_DEADLINE:g}s: {refused}")

    return heal


GROW_DEADLINE: Final = 150.0
"""How long the partitions request may keep failing (a broker fault overlapping it, its
restart, the controller's return); shorter than the fault itself."""


def _grow(bootstrap: str, refused: list[str]) -> None:
    pending = [
        NewPartitions(t.name, GROWN_PARTITIONS)
        for t in (USER_ACCESS_CHANGED, AGENT_MEMBERSHIP_CHANGED)
    ]
    admin = create_admin(bootstrap, client_id="chaos-partitions")
    deadline = time.monotonic() + GROW_DEADLINE
    refusals: dict[str, str] = {}
    while True:
        futures = admin.create_partitions(pending, request_timeout=10)
        pending = [r for r in pending if not _grown(futures[r.topic], r.topic, refusals)]
        if not pending:
            return
        if time.monotonic() >= deadline:
            refused.extend(f"{topic}: {reason}" for topic, reason in sorted(refusals.items()))
            return
        time.sleep(1.0)  # the broker is restarting: nothing to await but its return


def _grown(future: Future[None], topic: str, refusals: dict[str, str]) -> bool:
    """Whether a partitions request took, or found the topic grown already (a retry after
    a lost answer); a refusal's reason is kept in `refusals` for the failure message."""
    try:
        future.result(15)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.INVALID_PARTITIONS:
            return True
        refusals[topic] = str(error)
        return False
    return True


def _long_fault(system: ChaosSystem, kind: FaultKind) -> Heal:
    if kind is FaultKind.ALL_RELAYS_DOWN:
        return _all_down(system, RELAYS)
    if kind is FaultKind.ALL_CONSUMERS_DOWN:
        return _all_down(system, CONSUMERS)
    if kind is FaultKind.ALL_BATCHES_FAILING:
        return _refuse_role_model(system)
    return _flap_workers(system)


def _all_down(system: ChaosSystem, labels: tuple[str, ...]) -> Heal:
    """Every process of a kind stopped (SIGTERM) until healed: a Deployment scaled to 0, a
    crash loop, a node pool gone."""
    processes = [system.members[label].process for label in labels]
    for process in processes:
        if process.running():
            process.terminate()

    def heal() -> None:
        for process in processes:
            if not process.running():
                process.start()

    return heal


def _refuse_role_model(system: ChaosSystem) -> Heal:
    """A grant lost (a restore, a migration gone wrong): the workers may no longer read
    `role_assignments`, so every batch of every worker fails (42501) for as long as it
    lasts, while the platform's writes (the workload's role changes) go on and keep tasks
    waiting. The workers must page, give every attempt back and finish after it."""
    # The role the workers' privileges are granted to (pin_runtime.db_roles).
    statement = "{} SELECT ON identity.role_assignments {} identity_fanout_worker_acl"
    with psycopg.connect(system.base.identity_dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement.format("REVOKE", "FROM"))

    def heal() -> None:
        deadline = time.monotonic() + LOCK_ACQUIRE_DEADLINE
        while True:
            try:
                with psycopg.connect(
                    system.base.identity_dsn, autocommit=True, connect_timeout=5
                ) as conn:
                    conn.execute(statement.format("GRANT", "TO"))
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
            else:
                return

    return heal


def _flap_workers(system: ChaosSystem) -> Heal:
    """Every worker's path to PostgreSQL down and up in turns, until healed."""
    proxies = [p for label in WORKERS if (p := system.members[label].postgres) is not None]
    healed = threading.Event()

    def flap() -> None:
        while not healed.is_set():
            for proxy in proxies:
                proxy.disable()
            if healed.wait(FLAP_SECONDS):
                break
            for proxy in proxies:
                proxy.enable()
            healed.wait(FLAP_SECONDS)
        for proxy in proxies:
            proxy.enable()

    flapper = threading.Thread(target=flap, name="chaos-flap", daemon=True)
    flapper.start()

    def heal() -> None:
        healed.set()
        flapper.join(30)

    return heal


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
