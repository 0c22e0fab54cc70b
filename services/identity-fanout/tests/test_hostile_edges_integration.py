"""Data and server settings no other test uses: every expiry the column can hold, a database
whose defaults work against the services, and neighbours on the identity database.

Each process kind runs as the chart runs it (its console script, its runtime role's login)
against a database whose defaults an operator or a neighbour could have set:
`DateStyle 'SQL, DMY'` (psycopg parses only ISO), `TimeZone 'Asia/Kathmandu'` (+05:45: a
year-9999 expiry renders as year 10000), a `search_path` that resolves `now()` to a decoy
schema's function first, and a statement timeout of 1 ms for every runtime login.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from identity_fanout.db_roles import OPERATOR, PRODUCER, RELAY, WORKER
from identity_fanout.outbox.rules import SLOTS
from identity_fanout.schema import OUTBOX_TABLES, migrate_database
from pin_contracts import decode_access_changed
from pin_testkit.hostile import make_hostile
from pin_testkit.ports import free_port
from pin_testkit.runtime_roles import login_name
from pin_testkit.seeding import Assignment, add_assignments, add_permissions, add_role
from pin_testkit.service import ServiceProcess, run_cli, service_environment
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]

# ExpiresAt as stored -> as the event must carry it (pin_contracts README "Timestamps").
EXPIRIES: Final[dict[str, datetime | None]] = {
    "infinity": None,
    "12000-06-01 00:00:00+00": None,
    "10000-01-01 00:00:00+00": None,
    "9999-12-31 23:59:59.999999+00": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "2100-01-01 12:00:00+00": datetime(2100, 1, 1, 12, tzinfo=UTC),
}
LAPSED: Final = ("-infinity", "2001-01-01 00:00:00+00", "4000-01-01 00:00:00+00 BC")
"""Past expiries: never in a snapshot, also not through a decoy `now()` that says 2000."""


@pytest.fixture
def hostile(identity_dsn: str, db: Conn, runtime_dsn: Callable[[str, str], str]) -> dict[str, str]:
    """The identity database made hostile (`pin_testkit.hostile`); the DSNs of its runtime
    logins by role."""
    dsns = {
        role.name: runtime_dsn(identity_dsn, role.name)
        for role in (WORKER, RELAY, OPERATOR, PRODUCER)
    }
    logins = [str(conninfo_to_dict(dsn)["user"]) for dsn in dsns.values()]
    make_hostile(db, logins)
    return dsns


def seed_expiring_role(db: Conn, users: int) -> tuple[uuid.UUID, dict[uuid.UUID, str]]:
    """A role of `users` users; the first users also hold an assignment with each expiry of
    EXPIRIES and LAPSED, written in SQL (Python holds none of the extreme ones)."""
    company = uuid.uuid4()
    role = add_role(db, "hostile-role", company_id=company, permissions=["docs.read"])
    other = add_role(db, "expiring", company_id=company)
    user_ids = sorted(uuid.uuid4() for _ in range(users))
    add_assignments(db, [Assignment(role_id=role, user_id=u, company_id=company) for u in user_ids])
    by_assignment: dict[uuid.UUID, str] = {}
    for user, stored in zip(user_ids, (*EXPIRIES, *LAPSED), strict=False):
        assignment = Assignment(role_id=other, user_id=user, company_id=company)
        add_assignments(db, [assignment])
        db.execute(
            "UPDATE identity.role_assignments SET expires_at = %s::timestamptz WHERE id = %s",
            (stored, assignment.id),
        )
        by_assignment[assignment.id] = stored
    add_permissions(db, ["docs.write"])
    return role, by_assignment


def check_events(db: Conn, expected_users: int, by_assignment: dict[uuid.UUID, str]) -> None:
    """Every outbox row decodes strictly; each expiry went out by the contract's rule."""
    payloads = [bytes(p) for (p,) in db.execute("SELECT payload FROM identity.outbox ORDER BY id")]
    assert len(payloads) == expected_users
    seen: dict[uuid.UUID, datetime | None] = {}
    for payload in payloads:
        event = decode_access_changed(payload).payload  # the contract's strict decode
        for snapshot in event.active_assignments:
            seen[snapshot.assignment_id] = snapshot.expires_at
    for assignment, stored in by_assignment.items():
        if stored in LAPSED:
            assert assignment not in seen, f"lapsed {stored} was sent"
        else:
            assert seen[assignment] == EXPIRIES[stored], stored


def task_id(db: Conn, role: uuid.UUID) -> uuid.UUID:
    row = db.execute(
        "SELECT id FROM identity.access_fanout_tasks WHERE role_id = %s", (role,)
    ).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def cli(dsn: str, *args: str, threshold: int = 1000) -> tuple[int, str, str]:
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=dsn,
        IDENTITY_FANOUT_INLINE_FANOUT_THRESHOLD=str(threshold),
    )
    result = run_cli("identity-fanout", args, env, timeout=60, check=False)
    return result.returncode, result.stdout, result.stderr


def test_a_small_role_with_every_expiry_the_column_holds_changes_inline(
    identity_dsn: str, db: Conn, hostile: dict[str, str]
) -> None:
    # Was: DataError "timestamp too large" (infinity, year 10000 in +05:45) or
    # NotImplementedError (DateStyle): a traceback, exit 1, the revocation never made.
    role, by_assignment = seed_expiring_role(db, users=len(EXPIRIES) + len(LAPSED))
    code, _out, err = cli(
        hostile[OPERATOR.name], "roles", "set-permissions", str(role), "docs.write"
    )
    assert code == 0, err
    check_events(db, len(EXPIRIES) + len(LAPSED), by_assignment)


def service(
    name: str, dsn: str, args: tuple[str, ...], tmp_path: Path, **env: str
) -> ServiceProcess:
    port = free_port()
    environment = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=dsn,
        IDENTITY_FANOUT_METRICS_HOST="127.0.0.1",
        IDENTITY_FANOUT_METRICS_PORT=str(port),
        IDENTITY_FANOUT_POLLING_INTERVAL="200ms",
        IDENTITY_FANOUT_RELAY_POLL_INTERVAL="200ms",
        **{f"IDENTITY_FANOUT_{k.upper()}": v for k, v in env.items()},
    )
    return ServiceProcess(
        name, "identity-fanout", args, environment, port, tmp_path / f"{name}.log"
    )


def test_every_process_kind_works_against_hostile_database_defaults(
    identity_dsn: str, db: Conn, hostile: dict[str, str], kafka_bootstrap: str, tmp_path: Path
) -> None:
    # Was: the worker died on its first claim (exit 1, again at every restart), the task
    # stayed Pending, and a 1 ms statement timeout of the login failed every statement.
    code, _out, err = cli(identity_dsn, "migrate")
    assert code == 0, err
    users = len(EXPIRIES) + len(LAPSED) + 3
    role, by_assignment = seed_expiring_role(db, users=users)
    code, out, err = cli(
        hostile[OPERATOR.name], "roles", "set-permissions", str(role), "docs.write", threshold=2
    )
    assert code == 0, err
    assert "queued as task " in out, out  # queued, not inline
    worker = service(
        "worker",
        hostile[WORKER.name],
        ("worker", "--no-relay"),
        tmp_path,
        inline_fanout_threshold="2",
        batch_size="4",
    )
    with worker.start():
        worker.wait_ready()
        wait_until(
            lambda: (
                db.execute(
                    "SELECT status FROM identity.access_fanout_tasks WHERE role_id = %s", (role,)
                ).fetchone()
                == ("Completed",)
            ),
            timeout=60,
            what="the task Completed",
            alive=[worker],
        )
    check_events(db, users, by_assignment)
    for args in (
        ("tasks", "list"),
        ("tasks", "show", str(task_id(db, role))),
        ("outbox", "status"),
    ):
        code, out, err = cli(hostile[OPERATOR.name], *args)
        assert code == 0, (args, err)
    agent, agency = str(uuid.uuid4()), str(uuid.uuid4())
    for change in (
        ("memberships", "join", agent, agency),
        ("memberships", "leave", agent, agency, "--reason", "SelfLeave"),
    ):
        code, out, err = cli(hostile[PRODUCER.name], *change)
        assert code == 0, (change, err)
    users += 2  # the two membership events wait in the outbox too
    relay = service(
        "relay", hostile[RELAY.name], ("relay",), tmp_path, kafka_bootstrap=kafka_bootstrap
    )
    with relay.start():
        relay.wait_ready()
        wait_until(
            lambda: db.execute("SELECT count(*) FROM identity.outbox").fetchone() == (0,),
            timeout=60,
            what="the relay drained the outbox",
            alive=[relay],
        )
        assert relay.metric("identity_outbox_published_total") >= users


# -- neighbours ---------------------------------------------------------------------------


def test_only_the_services_logins_may_connect_after_migrate(
    identity_dsn: str, runtime_dsn: Callable[[str, str], str]
) -> None:
    # A clone starts with PUBLIC's CONNECT, as any database does; migrate takes it away.
    consumer_login = runtime_dsn(identity_dsn, "rewards_membership_consumer")
    with psycopg.connect(consumer_login) as before:
        before.execute("SELECT 1")
    migrate_database(identity_dsn)
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(consumer_login).close()
    for role in (WORKER, RELAY, OPERATOR):
        with psycopg.connect(runtime_dsn(identity_dsn, role.name)) as own:
            assert own.execute("SELECT current_user").fetchone() == (login_name(role.name),)


def hold_locks(dsn: str, *, slots: Sequence[int], members: int) -> list[Conn]:
    """Sessions of a foreign login: the first holds `slots`, each holds the member lock."""
    sessions = [psycopg.connect(dsn, autocommit=True) for _ in range(max(1, members))]
    for number, session in enumerate(sessions):
        if number < members:
            session.execute(
                "SELECT pg_advisory_lock_shared(%s, 0)", (OUTBOX_TABLES.member_lock_class,)
            )
    for slot in slots:
        sessions[0].execute(
            "SELECT pg_advisory_lock(%s, %s)", (OUTBOX_TABLES.lane_lock_class, slot)
        )
    return sessions


def test_a_foreign_session_holding_lane_locks_is_reported_and_fake_members_change_nothing(
    relay_dsn: str,
    operator_dsn: str,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    # Was: with another login holding all 64 slot locks the relay published nothing and
    # logged nothing; with 7 fake members it took 1 lane of 8 and left 58 of 64 rows.
    lanes = 8
    relay = service(
        "relay",
        relay_dsn,
        ("relay",),
        tmp_path,
        kafka_bootstrap=kafka_bootstrap,
        outbox_lanes=str(lanes),
    )
    fake_members = hold_locks(operator_dsn, slots=(), members=7)
    # Every slot of lanes 0-3: those lanes cannot be taken while the squatter lives.
    squatter = hold_locks(
        operator_dsn, slots=[s for s in range(SLOTS) if s % lanes < lanes // 2], members=0
    )
    try:
        with relay.start():
            relay.wait_ready()
            wait_until(
                lambda: relay.metric("identity_outbox_foreign_lock_holders") == 8,
                timeout=30,
                what="the foreign sessions reported",
                alive=[relay],
            )
            # The fake members made no instance: this relay wants every lane, and gets
            # every lane the squatter leaves whole.
            wait_until(
                lambda: relay.metric("identity_outbox_lanes_held") == lanes // 2,
                timeout=30,
                what="the relay's share of free lanes",
                alive=[relay],
            )
            log = relay.log_text()
            assert log.count('"relay lane locks held by a foreign session"') == 8
            assert login_name(OPERATOR.name) in log
            for session in squatter:
                session.close()
            wait_until(
                lambda: relay.metric("identity_outbox_lanes_held") == lanes,
                timeout=30,
                what="every lane once the squatter is gone",
                alive=[relay],
            )
            wait_until(
                lambda: relay.metric("identity_outbox_foreign_lock_holders") == 7,
                timeout=30,
                what="the count follows",
                alive=[relay],
            )
    finally:
        for session in fake_members + squatter:
            session.close()
