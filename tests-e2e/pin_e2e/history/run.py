"""One history run on the real servers: the plan's writers on the outbox, real relay
processes publishing it to a topic of the run's own, the faults at their times, then the
settling and the checks.

The writers log in as the fan-out worker's role (it may INSERT into the outbox and read the
ids it was handed out, `currval`), the relays as the relay's role or as a login with the
relay's grants and without `pg_read_all_stats` (`relay_login_without_statistics`). A plain
confluent-kafka consumer reads the topic from its start the whole time.

Everything it starts it stops, whatever happens: the writers, the relays, the consumer, the
held transactions, and every prepared transaction of its own (one left behind would hold
the database's horizon for good).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Final
from uuid import uuid4

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from psycopg import sql
from psycopg.rows import TupleRow

from identity_fanout.db_roles import RELAY as RELAY_ROLE
from identity_fanout.db_roles import RUNTIME_ROLES
from identity_fanout.outbox.writer import OutboxMessage
from identity_fanout.schema import OUTBOX, OUTBOX_TABLES, SCHEMA
from pin_e2e.history.checks import Property, check_history, exercised, gauges_agree
from pin_e2e.history.model import (
    History,
    Outcome,
    Publication,
    Row,
    Txn,
    WriterKind,
    key_slot,
    payload,
    to_json,
    token_of,
)
from pin_e2e.history.plan import Action, ActionKind, Plan, RelaySpec, WriterSpec, late_commit
from pin_e2e.history.report import HistoryReport
from pin_e2e.system import IDENTITY_FANOUT, RELAY, WORKER, System
from pin_runtime.db_roles import RuntimeRole, apply_runtime_roles
from pin_testkit.ports import free_port
from pin_testkit.runtime_roles import ensure_login, runtime_dsn
from pin_testkit.service import ServiceProcess
from pin_testkit.topics import TopicFactory
from pin_testkit.waiting import ConditionTimeoutError, wait_until

__all__ = ["NO_STATISTICS_GROUP", "RELAY_SETTINGS", "relay_login_without_statistics", "run_history"]

log = logging.getLogger(__name__)

NO_STATISTICS_GROUP: Final = "pin_e2e_relay_without_stats"
"""A group with exactly the relay's grants and not a member of pg_read_all_stats."""
RELAY_SETTINGS: Final = {
    # Small reads and a small window: with a few thousand rows the relays read on after
    # their lanes' cursors while records are in flight, as they do with the defaults
    # during the drain of a large backlog.
    "RELAY_BATCH_SIZE": "50",
    "RELAY_WINDOW_RECORDS": "200",
    "RELAY_POLL_INTERVAL": "250ms",
    "LOG_LEVEL": "INFO",
}
ABORTED_SHARE: Final = 0.1
PREPARED_ROLLED_BACK_SHARE: Final = 0.2
SETTLE_MARGIN: Final = 10.0
"""Seconds beyond the bound that the settling waits for the last committed rows."""
GAUGE_TIMEOUT: Final = 30.0
RESCUE_TIMEOUT: Final = 45.0
JOIN_TIMEOUT: Final = 30.0
PARTITIONS: Final = 3
LANES_ACQUIRED: Final = "relay lanes acquired"


def relay_login_without_statistics(admin_dsn: str, database_dsn: str) -> tuple[str, ...]:
    """The relay's grants on `database_dsn`'s outbox for `NO_STATISTICS_GROUP`, which is
    no member of pg_read_all_stats, and its login; the groups to log in as.

    Applied with the service's own roles, as `migrate` applies them: CONNECT goes to the
    roles applied and is taken from PUBLIC."""
    role = RuntimeRole(
        name=NO_STATISTICS_GROUP,
        purpose="end-to-end tests: an outbox relay without pg_read_all_stats",
        grants=RELAY_ROLE.grants,
        reads_statistics=False,
    )
    with psycopg.connect(database_dsn) as conn:
        apply_runtime_roles(conn, schema=SCHEMA, roles=[*RUNTIME_ROLES, role])
    ensure_login(admin_dsn, NO_STATISTICS_GROUP)
    return (NO_STATISTICS_GROUP,)


class _Errors:
    """Exceptions of the run's threads: the run fails with the first one."""

    def __init__(self) -> None:
        self.found: list[tuple[str, BaseException]] = []

    def guard(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported by the run, not the thread
                log.exception("%s failed", name)
                self.found.append((name, exc))

        return run

    def raise_first(self) -> None:
        if self.found:
            name, exc = self.found[0]
            raise AssertionError(f"{name} failed: {exc!r}") from exc


# -- the writers -------------------------------------------------------------------------


@dataclass
class _Writers:
    plan: Plan
    dsn: str
    topic: str
    history: History
    gid_prefix: str
    stop: threading.Event = field(default_factory=threading.Event)
    errors: _Errors = field(default_factory=_Errors)
    threads: list[threading.Thread] = field(default_factory=list)
    _key_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _committed: dict[str, int] = field(default_factory=dict)
    """Committed writes of each serialized key so far (read and changed under its lock)."""

    def __post_init__(self) -> None:
        self._key_locks = {key: threading.Lock() for key in self.plan.serialized_keys}
        self._currval = f"SELECT currval(pg_get_serial_sequence('{OUTBOX_TABLES.qualified}', 'id'))"
        self._raw_insert = sql.SQL(
            "INSERT INTO {outbox} (topic, message_key, payload, headers, message_id, event_type,"
            " key_slot) VALUES (%s, %s, %s, '[]', %s, 'OutboxHistory', {slot}(%s)) RETURNING id"
        ).format(
            outbox=sql.Identifier(OUTBOX_TABLES.schema, OUTBOX_TABLES.outbox),
            slot=sql.Identifier(OUTBOX_TABLES.schema, OUTBOX_TABLES.key_slot_function),
        )

    def start(self) -> None:
        bodies: dict[str, Callable[[WriterSpec], None]] = {
            WriterKind.SERIALIZED: self._late,
            WriterKind.UNSERIALIZED: self._late,
            WriterKind.FLOOD: self._flood,
            WriterKind.PREPARED: self._prepared,
        }
        for spec in self.plan.writers:
            target = self.errors.guard(f"writer {spec.name}", partial(bodies[spec.kind], spec))
            thread = threading.Thread(target=target, name=f"history-{spec.name}", daemon=True)
            self.threads.append(thread)
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(JOIN_TIMEOUT)

    def finish(self) -> None:
        """Stop after the transactions under way, and wait for them."""
        self.stop.set()
        self.join()
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            raise AssertionError(f"writers still running after {JOIN_TIMEOUT}s: {alive}")

    # One row through the writers' statement (OutboxStore.write: the INSERT and the
    # NOTIFY), and the id it was handed.
    def _write(
        self, conn: psycopg.Connection[TupleRow], key: str, token: str, kind: WriterKind
    ) -> Row:
        at = time.time()
        message = OutboxMessage(
            topic=self.topic,
            key=key,
            value=payload(token, key, kind),
            headers=(),
            message_id=uuid4(),
            event_type="OutboxHistory",
        )
        OUTBOX.write(conn, [message])
        (row_id,) = conn.execute(self._currval).fetchone() or (0,)
        return Row(token, key, int(row_id), at)

    def _late(self, spec: WriterSpec) -> None:
        """One row per transaction, committed (or rolled back) late; a serialized key's
        writer holds the key's lock from before its INSERT until after its commit."""
        rng = random.Random(spec.seed)
        kind = WriterKind(spec.kind)
        serialized = kind is WriterKind.SERIALIZED
        keys = self.plan.serialized_keys if serialized else self.plan.unserialized_keys
        with psycopg.connect(self.dsn) as conn:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                key = rng.choice(keys)
                wait, abort = late_commit(rng), rng.random() < ABORTED_SHARE
                lock: AbstractContextManager[Any] = (
                    self._key_locks[key] if serialized else nullcontext()
                )
                with lock:
                    began = time.time()
                    row = self._write(conn, key, f"{spec.name}:{n}", kind)
                    time.sleep(wait)  # the late commit: the point of this writer
                    sent = time.time()
                    conn.rollback() if abort else conn.commit()
                    ended = time.time()
                    if serialized and not abort:
                        row = self._next_of(key, row)
                outcome = Outcome.ABORTED if abort else Outcome.COMMITTED
                self.history.txns.append(Txn(row.token, kind, (row,), began, sent, ended, outcome))
                self.stop.wait(rng.uniform(0.0, 0.3))

    def _next_of(self, key: str, row: Row) -> Row:
        """The row with its place in its serialized key's commit order (under its lock)."""
        self._committed[key] = seq = self._committed.get(key, 0) + 1
        return Row(row.token, row.key, row.id, row.inserted_at, seq)

    def _flood(self, spec: WriterSpec) -> None:
        """Transactions of 1-25 rows of random keys, committed at once, `flood_rate` rows a
        second, never waiting for the relays (no backpressure); and every `fanout_every`
        seconds or so a fan-out burst on top (`_fanout`)."""
        rng = random.Random(spec.seed)
        plan = self.plan
        due = time.monotonic()
        bursts_until = due + plan.seconds * 0.75
        next_burst = due + rng.uniform(1.0, plan.fanout_every)
        with psycopg.connect(self.dsn) as conn:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                if next_burst <= time.monotonic() < bursts_until:
                    self._fanout(conn, rng, f"{spec.name}:{n}")
                    next_burst += rng.uniform(0.5, 1.5) * plan.fanout_every
                    continue
                size = rng.randint(1, 25)
                began = time.time()
                rows = tuple(
                    self._write(
                        conn, rng.choice(plan.flood_keys), f"{spec.name}:{n}:{i}", WriterKind.FLOOD
                    )
                    for i in range(size)
                )
                sent = time.time()
                conn.commit()
                ended = time.time()
                self.history.txns.append(
                    Txn(
                        f"{spec.name}:{n}",
                        WriterKind.FLOOD,
                        rows,
                        began,
                        sent,
                        ended,
                        Outcome.COMMITTED,
                    )
                )
                due += size / plan.flood_rate
                self.stop.wait(max(0.0, due - time.monotonic()))

    def _fanout(self, conn: psycopg.Connection[TupleRow], rng: random.Random, name: str) -> None:
        """A fan-out's page: one row for each of many users, in slot order, by one pipelined
        statement per row and one NOTIFY (OutboxStore.wake_relays), committed at once."""
        users = rng.sample(self.plan.fanout_users, rng.randint(*self.plan.fanout_rows))
        users.sort(key=lambda user: (key_slot(user), user))
        tokens = [f"{name}:{i}" for i in range(len(users))]
        began = time.time()
        with conn.cursor() as cursor:
            cursor.executemany(
                self._raw_insert,
                [
                    (self.topic, user, payload(token, user, WriterKind.FANOUT), uuid4(), user)
                    for user, token in zip(users, tokens, strict=True)
                ],
                returning=True,
            )
            ids = [int((cursor.fetchone() or (0,))[0]) for _ in cursor.results()]
        OUTBOX.wake_relays(conn)
        rows = tuple(
            Row(token, user, row_id, began)
            for user, token, row_id in zip(users, tokens, ids, strict=True)
        )
        sent = time.time()
        conn.commit()
        ended = time.time()
        self.history.txns.append(
            Txn(name, WriterKind.FANOUT, rows, began, sent, ended, Outcome.COMMITTED)
        )

    def _prepared(self, spec: WriterSpec) -> None:
        """A foreign writer: raw INSERTs (no NOTIFY), PREPARE TRANSACTION, then COMMIT
        PREPARED (or ROLLBACK PREPARED) up to 3 s later. Of a serialized key it holds the
        key's lock until then, as the application's writers of the key would wait."""
        rng = random.Random(spec.seed)
        with psycopg.connect(self.dsn) as conn:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                pool = rng.choice(("serialized", "unserialized", "flood"))
                if pool == "serialized":
                    keys = [rng.choice(self.plan.serialized_keys)]
                else:
                    choices = (
                        self.plan.unserialized_keys
                        if pool == "unserialized"
                        else self.plan.flood_keys
                    )
                    keys = [rng.choice(choices) for _ in range(rng.randint(1, 3))]
                lock: AbstractContextManager[Any] = (
                    self._key_locks[keys[0]] if pool == "serialized" else nullcontext()
                )
                rollback = rng.random() < PREPARED_ROLLED_BACK_SHARE
                held = rng.uniform(0.3, 3.0)
                with lock:
                    txn = self._prepared_txn(conn, spec, n, keys, held=held, rollback=rollback)
                    if pool == "serialized" and txn.outcome is Outcome.COMMITTED:
                        row = self._next_of(keys[0], txn.rows[0])
                        txn = Txn(
                            txn.name,
                            txn.kind,
                            (row,),
                            txn.began_at,
                            txn.commit_sent_at,
                            txn.ended_at,
                            txn.outcome,
                            txn.prepared_at,
                        )
                self.history.txns.append(txn)
                self.stop.wait(rng.uniform(0.2, 1.0))

    def _prepared_txn(
        self,
        conn: psycopg.Connection[TupleRow],
        spec: WriterSpec,
        n: int,
        keys: list[str],
        *,
        held: float,
        rollback: bool,
    ) -> Txn:
        name = f"{spec.name}:{n}"
        conn.tpc_begin(f"{self.gid_prefix}{spec.name}-{n}")
        began = time.time()
        rows: list[Row] = []
        for i, key in enumerate(keys):
            at, token = time.time(), f"{name}:{i}"
            value = payload(token, key, WriterKind.PREPARED)
            cursor = conn.execute(self._raw_insert, (self.topic, key, value, uuid4(), key))
            (row_id,) = cursor.fetchone() or (0,)
            rows.append(Row(token, key, int(row_id), at))
        conn.tpc_prepare()
        prepared = time.time()
        time.sleep(held)  # the prepared transaction holds its ids: the point of this writer
        sent = time.time()
        conn.tpc_rollback() if rollback else conn.tpc_commit()
        outcome = Outcome.ABORTED if rollback else Outcome.COMMITTED
        return Txn(
            name, WriterKind.PREPARED, tuple(rows), began, sent, time.time(), outcome, prepared
        )


# -- the topic ----------------------------------------------------------------------------


class _TopicReader:
    """Every record of the run's topic from its first offset, in a thread of its own."""

    def __init__(self, bootstrap: str, topic: str, errors: _Errors) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"pin-e2e-history-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 0,
            }
        )
        self._consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        self.publications: list[Publication] = []
        self.tokens: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=errors.guard("topic reader", self._read), name="history-reader", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _read(self) -> None:
        try:
            while not self._stop.is_set():
                for message in self._consumer.consume(num_messages=500, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise AssertionError(f"reading the history's topic: {error}")
                    key = message.key()
                    token = token_of(message.value())
                    self.publications.append(
                        Publication(
                            partition=int(message.partition() or 0),
                            offset=int(message.offset() or 0),
                            timestamp=message.timestamp()[1] / 1000,
                            key=key.decode() if key else "",
                            token=token,
                        )
                    )
                    if token is not None:
                        self.tokens.add(token)
        finally:
            self._consumer.close()

    def missing(self, tokens: set[str]) -> set[str]:
        return tokens - self.tokens

    def close(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT)


# -- the relays ---------------------------------------------------------------------------


@dataclass
class _Fleet:
    system: System
    history: History
    without_statistics: tuple[str, ...]
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    specs: dict[str, RelaySpec] = field(default_factory=dict)
    stopping: list[threading.Thread] = field(default_factory=list)
    errors: _Errors = field(default_factory=_Errors)

    def start(self, spec: RelaySpec) -> None:
        process = self.processes.get(spec.label)
        if process is None:
            port = free_port()
            login = RELAY if spec.reads_statistics else self.without_statistics
            env = self.system.identity_env(
                login, METRICS_HOST="127.0.0.1", METRICS_PORT=str(port), **RELAY_SETTINGS
            )
            process = self.system.process(spec.label, IDENTITY_FANOUT, ["relay"], env, port)
            self.processes[spec.label] = process
            self.specs[spec.label] = spec
        process.start()
        self.history.note(time.time(), f"{spec.describe()} started")

    def kill(self, spec: RelaySpec) -> None:
        self.processes[spec.label].kill()
        self.history.note(time.time(), f"{spec.describe()} SIGKILL")

    def stop(self, spec: RelaySpec) -> None:
        """SIGTERM once it is ready, waited for in a thread: its lanes go back while the
        run goes on."""
        process = self.processes[spec.label]
        self.history.note(time.time(), f"{spec.describe()} SIGTERM")

        def stop() -> None:
            # One still starting has no lanes to hand over, nor its SIGTERM handler yet.
            process.wait_ready()
            code = process.terminate()
            self.history.note(time.time(), f"{spec.describe()} exited {code}")
            if code != 0:
                raise AssertionError(f"{spec.label} exited {code} on SIGTERM: {process.log_tail()}")

        thread = threading.Thread(target=self.errors.guard(f"stopping {spec.label}", stop))
        self.stopping.append(thread)
        thread.start()

    def running(self) -> list[ServiceProcess]:
        for thread in self.stopping:
            thread.join(JOIN_TIMEOUT)
        self.stopping.clear()
        return [p for p in self.processes.values() if p.running()]

    def restart_all(self) -> None:
        """SIGTERM every running relay, wait for each to exit, start each again: a new
        process reads its lanes from the outbox's first row."""
        running = [self.specs[p.name] for p in self.running()]
        for spec in running:
            self.stop(spec)
        self.running()  # the stops waited for
        for spec in running:
            self.start(spec)

    def lane_moves(self, since: float) -> tuple[int, int]:
        """Lanes acquired after `since` (every relay), and acquisitions by relays without
        pg_read_all_stats over the whole run."""
        moved = blind = 0
        for label, process in self.processes.items():
            for line in process.log_text().splitlines():
                if LANES_ACQUIRED not in line:
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("event") != LANES_ACQUIRED:
                    continue
                if not self.specs[label].reads_statistics:
                    blind += 1
                at = _timestamp(entry.get("ts"))
                if at is not None and at >= since:
                    moved += 1
        return moved, blind

    def gauges(self) -> dict[str, tuple[float | None, float | None]]:
        """Each running relay's backlog and oldest-age gauges (None: not there)."""
        found: dict[str, tuple[float | None, float | None]] = {}
        for process in self.running():
            try:
                metrics = process.metrics()
            except (OSError, AssertionError):
                found[process.name] = (None, None)
                continue
            found[process.name] = (
                metrics.get("identity_outbox_backlog"),
                metrics.get("identity_outbox_oldest_age_seconds"),
            )
        return found

    def close(self) -> None:
        for thread in self.stopping:
            thread.join(JOIN_TIMEOUT)
        for process in self.processes.values():
            process.cleanup()


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- transactions held beside the writers -------------------------------------------------


@dataclass
class _Held:
    """The unrelated prepared transactions and long transactions: each holds a transaction
    id and writes no outbox row."""

    dsn: str
    gid_prefix: str
    history: History
    open: dict[int, tuple[psycopg.Connection[TupleRow], str, float]] = field(default_factory=dict)
    counts: dict[ActionKind, int] = field(default_factory=dict)
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    def begin(self, kind: ActionKind) -> int:
        number = next(self._numbers)
        conn = psycopg.connect(self.dsn)
        if kind is ActionKind.UNRELATED_PREPARED:
            conn.tpc_begin(f"{self.gid_prefix}unrelated-{number}")
            conn.execute("SELECT pg_current_xact_id()")
            conn.tpc_prepare()
        else:
            conn.execute("SELECT pg_current_xact_id()")
        begun = time.time()
        self.open[number] = (conn, kind.value, begun)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.history.note(begun, f"{kind.value}: begun")
        return number

    def end(self, number: int) -> None:
        conn, what, begun = self.open.pop(number)
        with conn:
            if what == ActionKind.UNRELATED_PREPARED.value:
                conn.tpc_commit()
            else:
                conn.commit()
        ended = time.time()
        self.history.bystanders.append((begun, ended, what))
        self.history.note(ended, f"{what}: ended")

    def close(self) -> None:
        for number in list(self.open):
            conn, _, _ = self.open.pop(number)
            conn.close()


def _roll_back_prepared(dsn: str, prefix: str) -> None:
    """Every prepared transaction of `dsn`'s database whose name starts with `prefix`
    rolled back: a writer stopped between its PREPARE and its COMMIT PREPARED, an unrelated
    one still held (a prepared transaction outlives its session)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = [
            str(gid)
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s AND database = "
                "current_database()",
                (prefix + "%",),
            )
        ]
        for gid in left:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


# -- the run ------------------------------------------------------------------------------


class _Timeline:
    """The plan's actions (and the ends they schedule) at their seconds after `start`."""

    def __init__(self, start: float) -> None:
        self._start = start
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._numbers = itertools.count()

    def at(self, offset: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._due, (self._start + offset, next(self._numbers), action))

    def play_until(self, offset: float, stop: threading.Event) -> None:
        """Each action at its time, until `offset` (later ones stay due)."""
        end = self._start + offset
        while self._due and self._due[0][0] <= end:
            due, _, action = heapq.heappop(self._due)
            if stop.wait(max(0.0, due - time.monotonic())):
                return
            action()
        stop.wait(max(0.0, end - time.monotonic()))

    def play_rest(self) -> None:
        """What is still due (restarts, ends of held transactions), now, in order."""
        while self._due:
            _, _, action = heapq.heappop(self._due)
            action()


def run_history(system: System, admin_dsn: str, plan: Plan, *, bound: float) -> HistoryReport:
    """Play `plan` on `system`'s identity database and servers, settle, check."""
    started = time.monotonic()
    history = History(started=time.time())
    run_id = uuid.uuid4().hex[:8]
    gid_prefix = f"pin-e2e-history-{run_id}-"
    without_statistics = relay_login_without_statistics(admin_dsn, system.identity_dsn)
    topics = TopicFactory(system.bootstrap, prefix="pin-e2e-history")
    topic = topics.create(partitions=PARTITIONS)
    writers = _Writers(plan, runtime_dsn(system.identity_dsn, *WORKER), topic, history, gid_prefix)
    fleet = _Fleet(system, history, without_statistics, errors=writers.errors)
    held = _Held(system.identity_dsn, gid_prefix, history)
    reader = _TopicReader(system.bootstrap, topic, writers.errors)
    try:
        reader.start()
        for spec in plan.relays:
            fleet.start(spec)
        for process in fleet.running():
            process.wait_ready()
        properties, restarted_at, faults = _play(
            plan,
            history=history,
            writers=writers,
            fleet=fleet,
            held=held,
            reader=reader,
            bound=bound,
        )
    finally:
        writers.stop.set()
        writers.join()
        held.close()
        _roll_back_prepared(system.identity_dsn, gid_prefix)
        reader.close()
        fleet.close()
        topics.delete_all()
    writers.errors.raise_first()
    history.publications = sorted(reader.publications, key=lambda p: (p.partition, p.offset))
    history.restarted_at = restarted_at
    recorded = system.workdir / "history.json"
    recorded.write_text(to_json(history))
    verdict = check_history(history, bound=bound)
    return HistoryReport(
        plan=plan,
        bound=bound,
        history=history,
        properties=[*verdict.properties, *properties, exercised(history, faults)],
        seconds=time.monotonic() - started,
        rerun=f"PIN_HISTORY_SEED={plan.seed} PIN_HISTORY_SECONDS={plan.seconds:g}",
        recorded=str(recorded),
    )


def _play(
    plan: Plan,
    *,
    history: History,
    writers: _Writers,
    fleet: _Fleet,
    held: _Held,
    reader: _TopicReader,
    bound: float,
) -> tuple[list[Property], float | None, dict[str, int]]:
    load_start, load_wall = time.monotonic(), time.time()
    history.note(load_wall, f"load started: {len(plan.writers)} writers")
    timeline = _Timeline(load_start)
    played: dict[ActionKind, int] = {}
    for action in plan.actions:
        timeline.at(action.at, _action(action, fleet, held, timeline, played))
    first_fault = min((a.at for a in plan.actions if a.relay is not None), default=0.0)
    writers.start()
    timeline.play_until(plan.seconds, writers.stop)
    writers.finish()
    history.note(time.time(), "load ended: every writer done")
    timeline.play_rest()
    writers.errors.raise_first()

    committed = {r.token for t in history.txns if t.outcome is Outcome.COMMITTED for r in t.rows}
    settle = bound + SETTLE_MARGIN
    try:
        wait_until(
            lambda: not reader.missing(committed),
            timeout=settle,
            what="every committed row on the topic",
            interval=0.25,
        )
        history.note(time.time(), "settled: every committed row on the topic")
    except ConditionTimeoutError:
        history.note(
            time.time(),
            f"not settled after {settle:g}s: {len(reader.missing(committed))} committed rows "
            "not on the topic",
        )
    gauges = _gauges_against_status(fleet, history)
    restarted_at: float | None = None
    if reader.missing(committed):
        restarted_at = time.time()
        history.note(restarted_at, "every relay restarted, for the rows still missing")
        fleet.restart_all()
        try:
            wait_until(lambda: not reader.missing(committed), timeout=RESCUE_TIMEOUT, interval=0.25)
            history.note(time.time(), "every committed row on the topic after the restart")
        except ConditionTimeoutError:
            history.note(time.time(), f"{len(reader.missing(committed))} rows never published")
    moved, blind = fleet.lane_moves(load_wall + first_fault)
    faults = {
        "relays killed": played.get(ActionKind.KILL, 0),
        "relays started (lanes moved)": played.get(ActionKind.JOIN, 0),
        "relays stopped (lanes moved)": played.get(ActionKind.LEAVE, 0),
        "lanes taken over after the first fault": moved,
        "lane takes by relays without pg_read_all_stats": blind,
        "unrelated prepared transactions held": held.counts.get(ActionKind.UNRELATED_PREPARED, 0),
        "long transactions held": held.counts.get(ActionKind.LONG_TRANSACTION, 0),
    }
    return [gauges], restarted_at, faults


def _action(
    action: Action, fleet: _Fleet, held: _Held, timeline: _Timeline, played: dict[ActionKind, int]
) -> Callable[[], None]:
    def act() -> None:
        played[action.kind] = played.get(action.kind, 0) + 1
        relay = action.relay
        if action.kind is ActionKind.KILL and relay is not None:
            fleet.kill(relay)
            timeline.at(action.at + action.hold, lambda: fleet.start(relay))
        elif action.kind is ActionKind.JOIN and relay is not None:
            fleet.start(relay)
        elif action.kind is ActionKind.LEAVE and relay is not None:
            fleet.stop(relay)
        else:
            number = held.begin(action.kind)
            timeline.at(action.at + action.hold, lambda: held.end(number))

    return act


def _gauges_against_status(fleet: _Fleet, history: History) -> Property:
    """Once settled: the running relays' backlog gauges against `outbox status`, read before
    and after them (until they agree, at most GAUGE_TIMEOUT: a relay refreshes its gauges
    every 2 s per instance)."""
    seen: dict[str, Any] = {"status": None, "gauges": {}}

    def backlog() -> int:
        result = fleet.system.identity_cli("outbox", "status", "--json")
        return int(json.loads(result.stdout)["backlog"])

    def agree() -> bool:
        before = backlog()
        seen["gauges"] = fleet.gauges()
        seen["status"] = (before, backlog())
        return gauges_agree(seen["status"], seen["gauges"]).holds is True

    try:
        wait_until(
            agree, timeout=GAUGE_TIMEOUT, what="backlog gauges = outbox status", interval=1.0
        )
    except ConditionTimeoutError:
        history.note(time.time(), "backlog gauges never agreed with outbox status")
    return gauges_agree(seen["status"], seen["gauges"])
