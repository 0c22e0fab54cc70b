"""The operator's commands as an on-call engineer runs them against a real PostgreSQL:
destructive changes made explicit (`--allow-empty`, `--dry-run`), a fan-out followed
(`tasks show` progress, `--watch`, `tasks list --role`, `roles show`), `status` counting
live workers and each task once, `--json` everywhere and one null symbol in tables."""

from __future__ import annotations

import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg.rows import TupleRow
from worker_support import enqueue

from identity_fanout.fanout.batch import run_batch
from identity_fanout.fanout.queue import FanoutQueue, Unit
from identity_fanout.fanout.session_name import WORKER_SESSION_PREFIX
from pin_testkit.ports import free_port
from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.service import CommandResult, ServiceProcess, run_cli, script, service_environment
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

Conn = psycopg.Connection[TupleRow]


def cli(dsn: str, *args: str, **env: str) -> CommandResult:
    environment = service_environment(
        ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=dsn, COLUMNS="250", **env
    )
    return run_cli("identity-fanout", args, environment, timeout=60, check=False)


def as_json(result: CommandResult) -> Any:
    assert result.returncode == 0, result.stderr
    return msgspec.json.decode(result.stdout)


def role_state(db: Conn, role: uuid.UUID) -> tuple[int, list[str], int, int]:
    """The role's version and permissions, the tasks queued and the outbox's rows."""
    row = db.execute(
        "SELECT version FROM identity.role_definitions WHERE id = %s", (role,)
    ).fetchone()
    assert row is not None
    codes = [
        r[0]
        for r in db.execute(
            "SELECT permission_code FROM identity.role_permissions WHERE role_id = %s "
            "ORDER BY permission_code",
            (role,),
        )
    ]
    tasks = db.execute("SELECT count(*) FROM identity.access_fanout_tasks").fetchone()
    outbox = db.execute("SELECT count(*) FROM identity.outbox").fetchone()
    assert tasks is not None
    assert outbox is not None
    return row[0], codes, tasks[0], outbox[0]


def split_task(db: Conn, *, users: int = 90, shard_size: int = 30) -> tuple[uuid.UUID, Unit]:
    """A role's task split into shards, one shard walked for a batch of 10 users and still
    held: the state a worker leaves mid-task."""
    queue = FanoutQueue(lease=timedelta(minutes=5), max_attempts=5)
    role, _ = seed_role_with_users(db, users=users, other_roles=0, code=f"r-{uuid.uuid4().hex[:6]}")
    task_id = enqueue(db, db, role)
    task = queue.claim(db)
    assert task is not None
    assert queue.split(db, task, shard_size=shard_size) == -(-users // shard_size)
    shard = queue.claim(db)
    assert shard is not None
    assert shard.shard_no is not None
    run_batch(db, queue, shard, batch_size=10, correlation_id="ops-test")
    return task_id, shard


# -- destructive changes are explicit --------------------------------------------------------


def test_an_empty_permission_set_needs_allow_empty(db: Conn, identity_dsn: str) -> None:
    role, _ = seed_role_with_users(db, users=3, other_roles=0)
    before = role_state(db, role)

    refused = cli(identity_dsn, "roles", "set-permissions", str(role))
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: no PERMISSION_CODE given")
    assert "--allow-empty" in line
    assert role_state(db, role) == before

    emptied = as_json(
        cli(identity_dsn, "roles", "set-permissions", str(role), "--allow-empty", "--json")
    )
    assert (emptied["mode"], emptied["users"], emptied["dry_run"]) == ("inline", 3, False)
    assert role_state(db, role)[:2] == (before[0] + 1, [])


def test_dry_run_says_who_would_be_notified_and_how_and_writes_nothing(
    db: Conn, identity_dsn: str
) -> None:
    role, _ = seed_role_with_users(db, users=7, other_roles=0)
    add_permissions(db, ["deals.read"])
    before = role_state(db, role)
    args = ("roles", "set-permissions", str(role), "deals.read", "--dry-run")

    inline = as_json(cli(identity_dsn, *args, "--json"))
    assert (inline["mode"], inline["users"], inline["task_id"], inline["dry_run"]) == (
        "inline",
        7,
        None,
        True,
    )
    queued = as_json(
        cli(
            identity_dsn,
            *args,
            "--json",
            IDENTITY_FANOUT_INLINE_FANOUT_THRESHOLD="2",
            IDENTITY_FANOUT_SHARD_SIZE="3",
        )
    )
    assert (queued["mode"], queued["users"], queued["shards"], queued["dry_run"]) == (
        "queued",
        7,
        3,
        True,
    )
    said = cli(identity_dsn, *args, IDENTITY_FANOUT_INLINE_FANOUT_THRESHOLD="2")
    assert said.returncode == 0, said.stderr
    assert "queued, 7 user(s) would be notified by the workers (one unit)" in said.stdout
    assert "dry run: nothing changed" in said.stdout
    # The same statements ran and were rolled back: no version, no task, no event.
    assert role_state(db, role) == before


def test_set_permissions_json_counts_the_users_of_a_queued_role(
    db: Conn, identity_dsn: str
) -> None:
    role, _ = seed_role_with_users(db, users=5, other_roles=0)
    add_permissions(db, ["deals.read"])
    change = as_json(
        cli(
            identity_dsn,
            "roles",
            "set-permissions",
            str(role),
            "deals.read",
            "--json",
            IDENTITY_FANOUT_INLINE_FANOUT_THRESHOLD="0",
        )
    )
    assert (change["mode"], change["users"], change["dry_run"]) == ("queued", 5, False)
    assert change["task_id"]


# -- following a fan-out ---------------------------------------------------------------------


def test_tasks_show_gives_total_done_percentage_rate_and_eta_per_task_and_shard(
    db: Conn, identity_dsn: str
) -> None:
    task_id, _ = split_task(db)
    # No worker connected: no ETA, which would be finite and false, but the reason.
    idle = as_json(cli(identity_dsn, "tasks", "show", str(task_id), "--json"))["progress"]
    assert idle["eta_seconds"] is None
    assert idle["blocked"].startswith("no worker")
    assert {s["eta_seconds"] for s in idle["shards"]} == {None}
    assert "none, no worker" in cli(identity_dsn, "tasks", "show", str(task_id)).stdout
    # A worker's session (the name every worker session carries): the task can move.
    with psycopg.connect(identity_dsn, application_name=f"{WORKER_SESSION_PREFIX}ops-test:1"):
        check_live_progress(identity_dsn, task_id)
        # The batch above left its 10 rows in the outbox (no relay here): at a bound of 10
        # the workers hold their next batch.
        throttled = as_json(
            cli(
                identity_dsn,
                "tasks",
                "show",
                str(task_id),
                "--json",
                IDENTITY_FANOUT_MAX_OUTBOX_BACKLOG="10",
            )
        )["progress"]
        assert throttled["eta_seconds"] is None
        assert throttled["blocked"].startswith("throttled: 10 outbox row(s)")


def check_live_progress(identity_dsn: str, task_id: uuid.UUID) -> None:
    shown = as_json(cli(identity_dsn, "tasks", "show", str(task_id), "--json"))
    progress = shown["progress"]
    assert progress["blocked"] is None
    assert (progress["total"], progress["done"], progress["percent"]) == (90, 10, 11.1)
    assert progress["rate_basis"] == "life"
    assert progress["rate_per_second"] > 0
    assert progress["eta_seconds"] > 0
    assert [s["total"] for s in progress["shards"]] == [30, 30, 30]
    assert [s["done"] for s in progress["shards"]] == [10, 0, 0]
    assert progress["shards"][0]["percent"] == 33.3
    assert progress["shards"][1]["rate_per_second"] is None  # never claimed yet
    assert shown["task"]["user_count"] == 90
    assert [s["user_count"] for s in shown["shards"]] == [30, 30, 30]

    table = cli(identity_dsn, "tasks", "show", str(task_id))
    assert table.returncode == 0, table.stderr
    assert "10 of 90 user(s), 11.1%" in table.stdout
    assert "33.3%" in table.stdout
    assert "None" not in table.stdout  # one null symbol: `-`


def test_a_task_walked_whole_has_its_total_once_claimed(db: Conn, identity_dsn: str) -> None:
    queue = FanoutQueue(lease=timedelta(minutes=5), max_attempts=5)
    role, _ = seed_role_with_users(db, users=4, other_roles=0)
    task_id = enqueue(db, db, role)
    pending = as_json(cli(identity_dsn, "tasks", "show", str(task_id), "--json"))
    assert (pending["progress"]["total"], pending["progress"]["eta_seconds"]) == (None, None)
    assert "None" not in cli(identity_dsn, "tasks", "show", str(task_id)).stdout
    task = queue.claim(db)
    assert task is not None
    assert queue.split(db, task, shard_size=30) == 0
    claimed = as_json(cli(identity_dsn, "tasks", "show", str(task_id), "--json"))
    assert (claimed["progress"]["total"], claimed["shards"]) == (4, [])


def test_tasks_list_filters_by_role_shows_its_code_and_takes_any_case(
    db: Conn, identity_dsn: str
) -> None:
    first, _ = seed_role_with_users(db, users=2, other_roles=0, code="sales-managers")
    second, _ = seed_role_with_users(db, users=2, other_roles=0, code="auditors")
    mine, theirs = enqueue(db, db, first), enqueue(db, db, second)
    db.execute("UPDATE identity.access_fanout_tasks SET status = 'Failed' WHERE id = %s", (theirs,))

    listed = cli(identity_dsn, "tasks", "list", "--role", str(first), "--json")
    rows = [msgspec.json.decode(line) for line in as_json_lines(listed)]
    assert [(r["id"], r["role_code"]) for r in rows] == [(str(mine), "sales-managers")]
    failed = cli(identity_dsn, "tasks", "list", "--status", "failed", "--json")
    assert [msgspec.json.decode(line)["id"] for line in as_json_lines(failed)] == [str(theirs)]
    table = cli(identity_dsn, "tasks", "list")
    assert table.returncode == 0, table.stderr
    assert "sales-managers" in table.stdout
    assert "auditors" in table.stdout
    assert "None" not in table.stdout


def as_json_lines(result: CommandResult) -> list[str]:
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_roles_show_gives_version_users_permissions_and_pending_work(
    db: Conn, identity_dsn: str
) -> None:
    task_id, _ = split_task(db)
    row = db.execute(
        "SELECT role_id FROM identity.access_fanout_tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row is not None
    role = row[0]
    shown = as_json(cli(identity_dsn, "roles", "show", str(role), "--json"))
    assert (shown["role"]["version"], shown["users"]) == (2, 90)
    assert len(shown["permissions"]) == 1
    [pending] = shown["pending"]
    assert (pending["task"]["id"], pending["progress"]["done"]) == (str(task_id), 10)
    assert pending["progress"]["total"] == 90

    table = cli(identity_dsn, "roles", "show", str(role))
    assert table.returncode == 0, table.stderr
    for text in ("active users", "90", "pending work", "1 unfinished task(s)", "11.1%"):
        assert text in table.stdout, text

    unknown = cli(identity_dsn, "roles", "show", str(uuid.uuid4()))
    assert unknown.returncode == 1
    assert len(unknown.stderr.strip().splitlines()) == 1
    assert "does not exist" in unknown.stderr


# -- tasks show --watch ----------------------------------------------------------------------


def watch(dsn: str, task_id: uuid.UUID, out: Path) -> subprocess.Popen[bytes]:
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=dsn,
        COLUMNS="120",
        # A terminal as far as rich is concerned: the bars are drawn and redrawn.
        TTY_COMPATIBLE="1",
        TTY_INTERACTIVE="1",
    )
    with out.open("wb") as sink, out.with_suffix(".err").open("wb") as errors:
        return subprocess.Popen(
            [
                script("identity-fanout"),
                "tasks",
                "show",
                str(task_id),
                "--watch",
                "--interval",
                "100ms",
            ],
            env=env,
            stdout=sink,
            stderr=errors,
            stdin=subprocess.DEVNULL,
        )


ENDINGS = {
    "Completed": (0, "Completed: 90 user(s) notified"),
    "Failed": (3, "Failed after 10 user(s): boom"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_watch_draws_a_bar_per_shard_and_exits_as_the_task_ends(
    db: Conn, identity_dsn: str, tmp_path: Path, ending: str
) -> None:
    exit_code, last_line = ENDINGS[ending]
    task_id, _ = split_task(db)
    out = tmp_path / "watch.out"
    process = watch(identity_dsn, task_id, out)
    try:
        # It draws the task's bar and one per shard, at their progress, while it runs.
        wait_until(
            lambda: all(
                text in out.read_text(errors="replace")
                for text in ("shard 1", "shard 3", "10/90", "10/30", "━", "users/s (life)")
            ),
            30,
            "the watch drew its bars",
        )
        assert process.poll() is None
        if ending == "Completed":
            db.execute(
                "UPDATE identity.access_fanout_shards SET status = 'Completed', "
                "processed_count = 30, lease_expires_at = NULL WHERE task_id = %s",
                (task_id,),
            )
            db.execute(
                "UPDATE identity.access_fanout_tasks SET status = 'Completed', "
                "processed_count = 90, lease_expires_at = NULL, completed_at = now() "
                "WHERE id = %s",
                (task_id,),
            )
        else:
            db.execute(
                "UPDATE identity.access_fanout_tasks SET status = 'Failed', "
                "last_error = 'boom', lease_expires_at = NULL WHERE id = %s",
                (task_id,),
            )
        code = process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert code == exit_code, out.with_suffix(".err").read_text()
    text = out.read_text(errors="replace")
    assert f"task {task_id} {last_line}" in text
    if ending == "Completed":
        assert "90/90" in text
        assert "100%" in text


def test_watch_json_is_one_line_per_read_until_the_end(db: Conn, identity_dsn: str) -> None:
    task_id, _ = split_task(db)
    db.execute(
        "UPDATE identity.access_fanout_tasks SET status = 'Failed', last_error = 'boom', "
        "lease_expires_at = NULL WHERE id = %s",
        (task_id,),
    )
    result = cli(identity_dsn, "tasks", "show", str(task_id), "--watch", "--json")
    assert result.returncode == 3, result.stderr
    [line] = result.stdout.splitlines()
    assert msgspec.json.decode(line)["task"]["status"] == "Failed"


# -- status ------------------------------------------------------------------------------------


def test_status_counts_a_task_a_stopped_worker_handed_back_once(
    db: Conn, identity_dsn: str
) -> None:
    task_id, shard = split_task(db)
    # The worker stops: it hands its shard back; the task's rolled-up lease is still live.
    assert FanoutQueue(lease=timedelta(minutes=5), max_attempts=5).release(db, shard)
    lease = db.execute(
        "SELECT lease_expires_at > now() FROM identity.access_fanout_tasks WHERE id = %s",
        (task_id,),
    ).fetchone()
    assert lease == (True,)

    shown = as_json(cli(identity_dsn, "status", "--json"))
    assert shown["tasks"]["waiting"] == 1
    assert shown["tasks"]["being_walked"] == 0
    assert (shown["queue"]["backlog"], shown["queue"]["leased"]) == (1, 0)
    table = cli(identity_dsn, "status")
    assert table.returncode == 0, table.stderr
    assert "being walked" in table.stdout
    assert "0 task(s)" in table.stdout


def test_status_with_no_tasks_prints_no_age(identity_dsn: str) -> None:
    shown = as_json(cli(identity_dsn, "status", "--json"))
    assert shown["tasks"]["oldest_age_seconds"] is None
    assert (shown["workers"], shown["relays"]) == ([], 0)
    table = cli(identity_dsn, "status")
    assert table.returncode == 0, table.stderr
    assert "0.0s old" not in table.stdout
    [oldest] = [line for line in table.stdout.splitlines() if "oldest unfinished" in line]
    assert oldest.split("oldest unfinished")[1].strip(" │|:") == "-"
    assert "None" not in table.stdout


def test_status_counts_a_live_worker_and_a_live_relay(
    worker_dsn: str,
    relay_dsn: str,
    operator_dsn: str,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    port = free_port()
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=worker_dsn,
        IDENTITY_FANOUT_KAFKA_BOOTSTRAP=kafka_bootstrap,
        IDENTITY_FANOUT_METRICS_HOST="127.0.0.1",
        IDENTITY_FANOUT_METRICS_PORT=str(port),
        IDENTITY_FANOUT_POLLING_INTERVAL="200ms",
    )
    worker = ServiceProcess(
        "worker", "identity-fanout", ("worker", "--no-relay"), env, port, tmp_path / "worker.log"
    )
    relay_port = free_port()
    relay = ServiceProcess(
        "relay",
        "identity-fanout",
        ("relay",),
        env
        | {
            "IDENTITY_FANOUT_DATABASE_DSN": relay_dsn,
            "IDENTITY_FANOUT_METRICS_PORT": str(relay_port),
        },
        relay_port,
        tmp_path / "relay.log",
    )

    def counted() -> tuple[int, int]:
        shown = as_json(cli(operator_dsn, "status", "--json"))
        return len(shown["workers"]), shown["relays"]

    with worker.start(), relay.start():
        worker.wait_ready()
        relay.wait_ready()
        wait_until(
            lambda: counted() == (1, 1),
            30,
            "the worker and the relay counted",
            alive=[worker, relay],
        )
        [seen] = as_json(cli(operator_dsn, "status", "--json"))["workers"]
        assert seen["name"].startswith("identity-fanout-worker@")
        assert seen["name"].endswith(f":{worker.pid}")
        table = cli(operator_dsn, "status")
        assert "1 live" in table.stdout
        assert "1 running" in table.stdout
        assert worker.terminate() == 0
        assert relay.terminate() == 0
    wait_until(lambda: counted() == (0, 0), 30, "the stopped processes no longer counted")


# -- memberships -------------------------------------------------------------------------------


def test_memberships_answer_in_json(producer_dsn: str) -> None:
    agent, agency = str(uuid.uuid4()), str(uuid.uuid4())
    joined = as_json(cli(producer_dsn, "memberships", "join", agent, agency, "--json"))
    assert (joined["membership"]["agent_user_id"], joined["membership"]["status"]) == (
        agent,
        "Active",
    )
    assert joined["membership"]["left_at"] is None
    assert joined["message_id"]
    left = as_json(
        cli(producer_dsn, "memberships", "leave", agent, agency, "--reason", "SelfLeave", "--json")
    )
    assert (left["membership"]["status"], left["membership"]["version"]) == ("Left", 2)

    usage = cli(producer_dsn, "memberships", "leave", agent)
    assert usage.returncode == 2
    [line] = usage.stderr.strip().splitlines()
    assert line.startswith("identity-fanout memberships leave: error:")
