"""One chaos campaign: the system up, the workload on, the schedule played, convergence, checks.

`run_campaign` returns a `CampaignReport` (faults with their timeline, alerts seen during
which faults, the invariants); the caller prints its table and fails on any violation with
the seed, so the same campaign can be replayed. A snapshot held on each service's database
follows the random faults (`faults.held_snapshots`); with `long`, the long faults follow
(`faults.long_faults`), and the alert matrix is checked: each raised the alerts it must
(`faults.pages`) while it lasted.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final
from uuid import UUID

import psycopg

from identity_fanout.fanout.queue import LeasedRow, list_shards, list_tasks
from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    IDENTITY_MEMBERSHIP_DLQ,
    USER_ACCESS_CHANGED,
    FanOutTaskStatus,
)
from pin_e2e.chaos.faults import (
    BROKER,
    HELD_SNAPSHOT_SECONDS,
    Fault,
    FaultKind,
    held_snapshots,
    keeps_firing,
    long_faults,
    pages,
    schedule,
)
from pin_e2e.chaos.injector import Heal, inject
from pin_e2e.chaos.invariants import (
    Invariant,
    access_delivered,
    cache_reset_in_time,
    duplicates_bounded,
    keys_on_one_partition,
    last_event_is_final,
    memberships_match,
    poison_isolated,
)
from pin_e2e.chaos.rules import campaign_rule_files
from pin_e2e.chaos.topology import ACCESS_CACHE, CONSUMERS, PROCESS_LABELS, ChaosSystem
from pin_e2e.chaos.workload import Driver, Role, seed_roles, write_relay_poison
from pin_e2e.checks import expected_snapshots, identity_memberships, rewards_rows
from pin_e2e.poison import NOT_JSON, empty_agent_event, oversized_dead_letter_event
from pin_testkit.local.prometheus import PrometheusServer
from pin_testkit.local.toxiproxy import ToxiproxyServer
from pin_testkit.private import PrivateKafka
from pin_testkit.private_servers import PrivateServers
from pin_testkit.records import produce, read_topic
from pin_testkit.waiting import wait_until

__all__ = ["CampaignReport", "run_campaign"]

log = logging.getLogger(__name__)

ROLE_SIZES: Final = {"chaos-large": 3000, "chaos-medium": 300, "chaos-small": 30}
BATCH_SIZE: Final = 100  # the workers' BATCH_SIZE (pin_e2e.system.WORKER_DEFAULTS)
QUARANTINE_ALERT: Final = "IdentityOutboxQuarantined"
DEAD_LETTER_ALERT: Final = "RewardsMembershipDeadLetters"
POISON_ALERTS: Final = frozenset({QUARANTINE_ALERT, DEAD_LETTER_ALERT})
CACHE_RESET_LIMIT: Final = 60.0
CONVERGE_TIMEOUT: Final = 300.0
SAMPLE_EVERY: Final = 1.0
RESOLVE_TIMEOUT: Final = 120.0
"""How long the alerts get to resolve once the system converged (and the poison records
were dealt with)."""
LONG_RESOLVE_TIMEOUT: Final = 600.0
"""The same after the long faults: an errors alert keeps its 5-minute window and its
10-minute `for` after a long outage."""
LONG_FAULTS_AFTER: Final = 60.0
"""Seconds between the end of the random faults' span and the first long fault."""
HELD_AFTER: Final = 30.0
"""Seconds between the end of the random faults' span and the held snapshots, and between
their end and the long faults (the horizon alerts resolve)."""


@dataclass
class CampaignReport:
    seed: int
    faults: list[Fault]
    timeline: list[tuple[float, str]] = field(default_factory=list)
    alerts: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Alert name -> the faults (numbers) active while it fired, or "poison"/"after"."""
    firing_at_end: set[str] = field(default_factory=set)
    invariants: list[Invariant] = field(default_factory=list)
    role_changes: int = 0
    membership_changes: int = 0
    access_events: int = 0
    converged_after: float = 0.0

    @property
    def violated(self) -> list[Invariant]:
        return [i for i in self.invariants if not i.holds]


@dataclass
class _Player:
    """Plays the schedule: injects each fault at its time, heals it when it is over, and
    samples the firing alerts in between."""

    system: ChaosSystem
    prometheus: PrometheusServer
    report: CampaignReport
    started: float = field(default_factory=time.monotonic)
    active: dict[int, tuple[float, Heal]] = field(default_factory=dict)
    _next_sample: float = 0.0

    def note(self, what: str) -> None:
        self.report.timeline.append((time.monotonic() - self.started, what))

    def play(self, faults: list[Fault]) -> None:
        for fault in faults:
            self.idle_until(self.started + fault.at)
            self.note(f"#{fault.number} {fault.describe()}")
            heal = inject(self.system, fault)
            self.active[fault.number] = (time.monotonic() + fault.duration, heal)
        self.idle_until(max((end for end, _ in self.active.values()), default=0.0))

    def idle_until(self, moment: float) -> None:
        while True:
            now = time.monotonic()
            for number, (end, heal) in sorted(self.active.items()):
                if end <= now:
                    heal()
                    del self.active[number]
                    self.note(f"#{number} healed")
            if now >= self._next_sample:
                self.sample()
                self._next_sample = now + SAMPLE_EVERY
            if now >= moment:
                return
            time.sleep(min(0.1, moment - now))  # the schedule's clock: nothing to await

    def sample(self) -> None:
        try:
            firing = self.prometheus.firing()
        except OSError:
            return
        during = [f"#{n}" for n in sorted(self.active)] or ["between faults"]
        for alert in firing:
            self.report.alerts[alert].update(during)


def _consumer_poison(bootstrap: str) -> list[tuple[int, int]]:
    limit = AGENT_MEMBERSHIP_CHANGED.max_message_bytes
    records = [NOT_JSON, empty_agent_event(uuid.uuid4()), oversized_dead_letter_event(limit)]
    delivered = produce(bootstrap, AGENT_MEMBERSHIP_CHANGED.name, records, max_message_bytes=limit)
    return [(d.partition, d.offset) for d in delivered]


def _final_versions(identity_dsn: str, roles: list[Role]) -> dict[str, int]:
    with psycopg.connect(identity_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT code, version FROM identity.role_definitions WHERE id = ANY(%s)",
            ([r.id for r in roles],),
        ).fetchall()
    return {str(code): int(version) for code, version in rows}


def _quarantined(identity_dsn: str) -> dict[UUID, int]:
    with psycopg.connect(identity_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT message_id, count(*) FROM identity.outbox_quarantine GROUP BY message_id"
        ).fetchall()
    return {UUID(str(m)): int(n) for m, n in rows}


def _outbox_empty(identity_dsn: str) -> Callable[[], bool]:
    def empty() -> bool:
        try:
            with psycopg.connect(identity_dsn, autocommit=True, connect_timeout=3) as conn:
                row = conn.execute("SELECT count(*) FROM identity.outbox").fetchone()
        except psycopg.OperationalError:
            return False
        return row is not None and row[0] == 0

    return empty


def _converge(
    system: ChaosSystem,
    player: _Player,
    agents: list[UUID],
    user_versions: dict[UUID, int],
    changed_at: float,
) -> float:
    """Wait (bounded) for the outbox to drain, the projection to match identity and every
    access cache to hold the final Versions; the seconds until the projection matched."""
    identity_dsn, processes = system.base.identity_dsn, system.processes()
    took = wait_until(
        _outbox_empty(identity_dsn),
        timeout=CONVERGE_TIMEOUT,
        what="outbox drained",
        interval=0.5,
        alive=processes,
    )

    def memberships_converged() -> bool:
        return memberships_match(
            identity_memberships(identity_dsn, agents),
            rewards_rows(system.base.rewards_dsn, agents),
        ).holds

    took += wait_until(
        memberships_converged,
        timeout=CONVERGE_TIMEOUT,
        what="projection converged",
        interval=0.5,
        alive=processes,
    )
    player.note("converged")

    def caches_reset() -> bool:
        return cache_reset_in_time(
            system.applied_log, user_versions, changed_at, float("inf")
        ).holds

    wait_until(caches_reset, timeout=CONVERGE_TIMEOUT, what="access caches reset", interval=0.5)
    player.sample()
    return took


def run_campaign(
    servers: PrivateServers,
    workdir: Path,
    *,
    seed: int,
    faults: int,
    span: float,
    long: bool = False,
) -> CampaignReport:
    with (
        ToxiproxyServer(workdir / "toxiproxy") as toxiproxy,
        PrivateKafka.launch(proxied=len(PROCESS_LABELS)) as broker,
        PrometheusServer(
            workdir / "prometheus", rule_files=campaign_rule_files(workdir / "rules")
        ) as prometheus,
    ):
        system = ChaosSystem.create(servers, broker, toxiproxy, workdir)
        try:
            return _run(system, prometheus, seed=seed, count=faults, span=span, long=long)
        finally:
            system.stop_all()


def _settle_poison(system: ChaosSystem, player: _Player, prometheus: PrometheusServer) -> None:
    """The operator's part: the poison records can never go through; once dealt with, the
    relay's row is discarded and the dead letters are resolved (not replayed), and their
    alerts must resolve."""
    discarded = system.base.identity_cli(
        "outbox", "quarantine", "discard", "--all", "--reason", "chaos", "--json"
    )
    count = json.loads(discarded.stdout)["count"]
    player.note(f"{count} quarantined rows discarded by the operator")
    # The campaign's own broker holds the DLQ (the base system's settings name another).
    resolved = system.base.rewards_cli(
        "dlq",
        "resolve",
        "--all",
        "--reason",
        "chaos poison records",
        "--json",
        KAFKA_BOOTSTRAP=system.bootstrap,
    )
    totals = json.loads(resolved.stdout.splitlines()[-1])  # the last line: the totals
    player.note(f"{totals['results']['resolved']} dead letters resolved by the operator")
    try:
        wait_until(
            lambda: not (prometheus.firing() & POISON_ALERTS),
            timeout=CONVERGE_TIMEOUT,
            what=f"{', '.join(sorted(POISON_ALERTS))} resolved after the discard and resolve",
            interval=1.0,
        )
    except AssertionError as exc:  # say what the alerts still see, per process
        seen = [
            f"{r['metric'].get('instance')}={r['value'][1]}"
            for r in prometheus.query(
                "rewards_identity_membership_dlq_unreplayed or identity_outbox_quarantine_rows"
            )
        ]
        raise AssertionError(f"{str(exc).splitlines()[0]}; gauges: {', '.join(seen)}") from exc


def _matrix(report: CampaignReport) -> Invariant:
    """Every fault that outlasted its alerts' windows raised them while it lasted."""
    missing = []
    for fault in report.faults:
        fired = {a for a, during in report.alerts.items() if f"#{fault.number}" in during}
        if absent := pages(fault) - fired:
            missing.append(f"#{fault.number} {fault.kind}: {', '.join(sorted(absent))}")
    paged = [f for f in report.faults if pages(f)]
    return Invariant(
        "every stall paged (the alert matrix)",
        not missing,
        "; ".join(missing) or f"{len(paged)} long fault(s), each raised its alerts",
    )


def _nothing_firing(report: CampaignReport) -> Invariant:
    """No alert fires once converged, but those of a grown topic: it stays grown."""
    lasting = keeps_firing(report.faults)
    unexpected = report.firing_at_end - lasting
    kept = report.firing_at_end & lasting
    return Invariant(
        "no alert firing once converged",
        not unexpected,
        f"firing at the end: {', '.join(sorted(unexpected)) or 'none'}"
        + (f" (the grown topics' {', '.join(sorted(kept))} fire on)" if kept else ""),
    )


def _unfinished_work(identity_dsn: str, roles: list[Role]) -> list[str]:
    """The fan-out tasks and shards not Completed, one line each, as the queue's gateway
    reads them (`tasks list` / `tasks show`): what a failed convergence was waiting on."""
    codes = {r.id: r.code for r in roles}
    now = datetime.now(UTC)

    def line(what: str, row: LeasedRow) -> str:
        lease = row.lease_expires_at
        left = "-" if lease is None else f"{(lease - now).total_seconds():.1f}s"
        return (
            f"{what}: {row.status}, attempt {row.attempt_count}, {row.processed_count} done, "
            f"lease {left}, last error {row.last_error!r}"
        )

    lines = []
    with psycopg.connect(identity_dsn, autocommit=True, connect_timeout=3) as conn:
        for status in (
            FanOutTaskStatus.PENDING,
            FanOutTaskStatus.IN_PROGRESS,
            FanOutTaskStatus.FAILED,
        ):
            for task in list_tasks(conn, status=status):
                name = f"task {codes.get(task.role_id, task.role_id)} v{task.role_version}"
                lines.append(line(f"{name} ({task.shard_count} shard(s))", task))
                lines += [
                    line(f"{name} shard {shard.shard_no}", shard)
                    for shard in list_shards(conn, task.id)
                    if shard.status != FanOutTaskStatus.COMPLETED.value
                ]
    return lines


def _note_not_converged(
    system: ChaosSystem, player: _Player, roles: list[Role], detail: str
) -> None:
    """On the timeline, after a wait ran out: which, the unfinished fan-out work, the
    processes down."""
    player.note(f"NOT converged: {detail}")
    try:
        unfinished = _unfinished_work(system.base.identity_dsn, roles)
    except psycopg.Error as error:
        unfinished = [f"(fan-out work not readable: {error})"]
    for line in unfinished or ["no fan-out task or shard unfinished"]:
        player.note(line)
    for label, member in system.members.items():
        if not member.process.running():
            player.note(f"{label} not running")


def _cuts_consumers(fault: Fault) -> bool:
    """Whether `fault` may stop a consumer between a dead letter's acknowledgement and its
    inbox mark: the consumer killed or cut off, or its partitions lost while the broker is
    down (the next owner does not know what the last one had written)."""
    return (
        fault.target in CONSUMERS
        or fault.target == BROKER
        or fault.kind in (FaultKind.ALL_CONSUMERS_DOWN,)
    )


def _failed_tasks(identity_dsn: str) -> Invariant:
    with psycopg.connect(identity_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM identity.access_fanout_tasks WHERE status = 'Failed'"
        ).fetchone()
    failed = int(row[0]) if row else -1
    return Invariant("no fan-out task Failed (outages are not poison)", failed == 0, f"{failed}")


def _plan(system: ChaosSystem, *, seed: int, count: int, span: float, long: bool) -> list[Fault]:
    """The random faults over `span`, then the held snapshots, then (`long`) the long ones."""
    plan = schedule(seed, count, system.dependencies(), span=span)
    plan += held_snapshots(after=span + HELD_AFTER, first_number=len(plan) + 1)
    if long:
        after = span + 2 * HELD_AFTER + HELD_SNAPSHOT_SECONDS + LONG_FAULTS_AFTER
        plan += long_faults(after=after, first_number=len(plan) + 1)
    return plan


def _run(
    system: ChaosSystem,
    prometheus: PrometheusServer,
    *,
    seed: int,
    count: int,
    span: float,
    long: bool,
) -> CampaignReport:
    identity_dsn = system.base.identity_dsn
    roles = seed_roles(identity_dsn, ROLE_SIZES)
    system.build()
    plan = _plan(system, seed=seed, count=count, span=span, long=long)
    report = CampaignReport(seed, plan)
    for member in system.members.values():
        member.process.start()
    for label, member in system.members.items():
        member.process.wait_ready()
        job = "access-cache" if label == ACCESS_CACHE else member.process.program
        prometheus.scrape(job, f"127.0.0.1:{member.process.metrics_port}")
    player = _Player(system, prometheus, report)
    relay_poison = [
        write_relay_poison(identity_dsn, 2 * AGENT_MEMBERSHIP_CHANGED.max_message_bytes)
    ]
    consumer_poison = _consumer_poison(system.bootstrap)
    player.note("poison records written (1 outbox row, 3 membership records)")
    driver = Driver(identity_dsn, roles, seed).start()
    player.note("workload started")
    try:
        player.play(plan)
    finally:
        driver.stop()
        system.toxiproxy.heal_all()
    player.note("faults over, workload stopped")
    for member in system.members.values():
        if not member.process.running():
            member.process.start()
    driver.change_every_role()
    changed_at = time.time()
    player.note("last change of every role")
    final = _final_versions(identity_dsn, roles)
    agents = driver.agent_ids
    user_versions = {u: final[r.code] for r in roles for u in r.users}
    quarantined: dict[UUID, int] = {}
    converged = Invariant("the system converged after the faults", True, "")
    try:
        report.converged_after = _converge(system, player, agents, user_versions, changed_at)
        quarantined = _quarantined(identity_dsn)
        _settle_poison(system, player, prometheus)
        wait_until(
            # A grown topic stays grown: its alerts fire to the end (the matrix checks them).
            lambda: not (prometheus.firing() - keeps_firing(report.faults)),
            timeout=LONG_RESOLVE_TIMEOUT if long else RESOLVE_TIMEOUT,
            what="every alert resolved",
            interval=1.0,
        )
    except AssertionError as exc:  # a wait's deadline: the checks below say what is off
        converged = Invariant(converged.name, False, str(exc).splitlines()[0])
        _note_not_converged(system, player, roles, converged.detail)
        quarantined = quarantined or _quarantined(identity_dsn)
    report.firing_at_end = prometheus.firing()
    access = read_topic(system.bootstrap, USER_ACCESS_CHANGED.name)
    report.access_events = len(access)
    report.role_changes = driver.role_changes
    report.membership_changes = driver.membership_changes
    expected = {
        r.code: (final[r.code], expected_snapshots(identity_dsn, list(r.users))) for r in roles
    }
    report.invariants = [
        converged,
        access_delivered(access, expected),
        last_event_is_final(access, user_versions),
        keys_on_one_partition(
            {
                USER_ACCESS_CHANGED.name: access,
                AGENT_MEMBERSHIP_CHANGED.name: read_topic(
                    system.bootstrap, AGENT_MEMBERSHIP_CHANGED.name
                ),
            }
        ),
        duplicates_bounded(access, count, BATCH_SIZE),
        memberships_match(
            identity_memberships(identity_dsn, agents),
            rewards_rows(system.base.rewards_dsn, agents),
        ),
        poison_isolated(
            quarantined,
            relay_poison,
            read_topic(system.bootstrap, IDENTITY_MEMBERSHIP_DLQ.name),
            consumer_poison,
            sum(map(_cuts_consumers, report.faults)),
        ),
        cache_reset_in_time(system.applied_log, user_versions, changed_at, CACHE_RESET_LIMIT),
        _failed_tasks(identity_dsn),
        _matrix(report),
        Invariant(
            "the poison records raised their alerts",
            set(report.alerts) >= POISON_ALERTS,
            f"fired: {', '.join(sorted(report.alerts)) or 'none'}",
        ),
        _nothing_firing(report),
    ]
    return report
