"""The `identity-fanout` command as an operator runs it: exit codes and messages."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import TupleRow

from pin_testkit.seeding import add_permissions, seed_role_with_users
from pin_testkit.service import CommandResult, run_cli, service_environment


def run(*args: str, env: dict[str, str] | None = None) -> CommandResult:
    # rich tables take the width a terminal would give them
    base = service_environment(("IDENTITY_FANOUT_",), COLUMNS="250")
    return run_cli("identity-fanout", args, base | (env or {}), timeout=60, check=False)


def test_missing_dsn_is_a_config_error_naming_the_variable() -> None:
    result = run("tasks", "list")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "config error: IDENTITY_FANOUT_DATABASE_DSN: required but not set"
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("IDENTITY_FANOUT_BATCH_SIZE", "lots"),
        ("IDENTITY_FANOUT_BATCH_SIZE", "0"),
        ("IDENTITY_FANOUT_POLLING_INTERVAL", "soon"),
        ("IDENTITY_FANOUT_MAX_LEASE_DURATION", "0s"),
        ("IDENTITY_FANOUT_LOG_LEVEL", "LOUD"),
        ("IDENTITY_FANOUT_METRICS_PORT", "70000"),
    ],
)
def test_bad_values_stop_with_exit_2_and_one_line(variable: str, value: str) -> None:
    result = run("tasks", "list", env={"IDENTITY_FANOUT_DATABASE_DSN": "dbname=x", variable: value})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"config error: {variable}: ")


PASSWORD = "n0t-in-any-output"


@pytest.mark.parametrize("command", ["worker", "relay"])
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # Python's timedelta overflowed (a traceback, exit 1).
        ("IDENTITY_FANOUT_DB_STATEMENT_TIMEOUT", "99999999999d"),
        ("IDENTITY_FANOUT_POLLING_INTERVAL", "99999999999999999999"),
        # PostgreSQL refuses them at every connect: retried for ever as an outage.
        ("IDENTITY_FANOUT_DB_STATEMENT_TIMEOUT", "30d"),
        ("IDENTITY_FANOUT_DB_IDLE_IN_TRANSACTION_TIMEOUT", "25d"),
        ("IDENTITY_FANOUT_DB_KEEPALIVES_IDLE", "40000s"),
        # librdkafka's message.timeout.ms wrapped negative: every relay round failed.
        ("IDENTITY_FANOUT_RELAY_DELIVERY_TIMEOUT", "30d"),
        # libpq refuses them at every connect (the relay logged "retriable": false, retried).
        ("IDENTITY_FANOUT_DATABASE_DSN", f"host=127.0.0.1 port=notaport password={PASSWORD}"),
        ("IDENTITY_FANOUT_DATABASE_DSN", f"host=127.0.0.1 sslmodee=require password={PASSWORD}"),
        ("IDENTITY_FANOUT_DATABASE_DSN", f"postgresql://u:{PASSWORD}@[127.0.0.1:5432/db"),
        ("IDENTITY_FANOUT_DATABASE_DSN", f"host='127.0.0.1 password={PASSWORD}"),
        ("IDENTITY_FANOUT_KAFKA_BOOTSTRAP", "kafka:9092,broker two:9092"),
        # An address of no interface here (TEST-NET-1): the bind fails, nothing is sent.
        ("IDENTITY_FANOUT_METRICS_HOST", "192.0.2.1"),
    ],
)
def test_a_value_its_consumer_would_refuse_stops_the_process_at_start(
    command: str, variable: str, value: str
) -> None:
    env = {
        "IDENTITY_FANOUT_DATABASE_DSN": f"host=127.0.0.1 port=1 password={PASSWORD}",
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "IDENTITY_FANOUT_METRICS_HOST": "127.0.0.1",
        "IDENTITY_FANOUT_METRICS_PORT": "0",
        variable: value,
    }
    result = run(command, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"config error: {variable}: ")
    assert PASSWORD not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr + result.stdout


def test_worker_needs_a_kafka_bootstrap() -> None:
    result = run("worker", env={"IDENTITY_FANOUT_DATABASE_DSN": "dbname=x"})
    assert result.returncode == 2
    assert "IDENTITY_FANOUT_KAFKA_BOOTSTRAP" in result.stderr


def test_malformed_ids_are_usage_errors() -> None:
    result = run("tasks", "show", "not-a-uuid", env={"IDENTITY_FANOUT_DATABASE_DSN": "dbname=x"})
    assert result.returncode == 2
    assert "not a UUID: 'not-a-uuid'" in result.stderr


@pytest.mark.integration
def test_operator_session(identity_dsn: str, operator_dsn: str) -> None:
    # The runbook commands log in as the operator's role; migrate as the owner.
    env = {
        "IDENTITY_FANOUT_DATABASE_DSN": operator_dsn,
        "IDENTITY_FANOUT_INLINE_FANOUT_THRESHOLD": "2",
    }
    db: psycopg.Connection[TupleRow]
    with psycopg.connect(identity_dsn, autocommit=True) as db:
        role, _ = seed_role_with_users(db, users=3, other_roles=0)
        add_permissions(db, ["docs.read", "docs.write"])

    as_owner = env | {"IDENTITY_FANOUT_DATABASE_DSN": identity_dsn}
    migrated = run("migrate", env=as_owner)
    # What the command says, alone on stdout (its log lines, the runtime roles re-granted,
    # are on stderr).
    assert migrated.stdout.splitlines() == ["schema is up to date"], migrated.stderr

    changed = run(
        "roles", "set-permissions", str(role), "docs.read", "docs.write", "--json", env=env
    )
    assert changed.returncode == 0, changed.stderr
    change = json.loads(changed.stdout)
    assert (change["version"], change["mode"]) == (2, "queued")
    task_id = change["task_id"]

    listed = run("tasks", "list", "--status", "Pending", "--json", env=env)
    assert listed.returncode == 0
    assert task_id in [json.loads(line)["id"] for line in listed.stdout.splitlines()]

    shown = run("tasks", "show", task_id, "--json", env=env)
    assert json.loads(shown.stdout)["task"]["reason"] == "RolePermissionsChanged"

    refused = run("tasks", "replay", task_id, env=env)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"error: fan-out task {task_id} is Pending; only Failed tasks are replayed"
    )

    unknown = run("roles", "set-permissions", str(uuid.uuid4()), "docs.read", env=env)
    assert unknown.returncode == 1
    assert "does not exist" in unknown.stderr

    bad_code = run("roles", "set-permissions", str(role), "nope", env=env)
    assert (bad_code.returncode, bad_code.stderr.strip()) == (
        1,
        "error: unknown permission code(s): nope",
    )


def test_version_is_one_line_on_stdout() -> None:
    result = run("--version", env={"PIN_BUILD_REVISION": "abc1234"})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    [line] = result.stdout.splitlines()
    version = importlib.metadata.version("identity-fanout")
    assert line.startswith(f"identity-fanout {version} (revision abc1234, pin-contracts "), line


def test_database_down_is_one_line_not_a_traceback() -> None:
    result = run(
        "tasks",
        "list",
        env={"IDENTITY_FANOUT_DATABASE_DSN": "postgresql://x@127.0.0.1:1/db?connect_timeout=2"},
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: database unavailable:")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "module",
    ["identity_fanout.cli", "identity_fanout.ops.outbox", "identity_fanout.outbox.quarantine"],
)
def test_operator_commands_load_no_kafka_client(module: str) -> None:
    # The runbook commands never talk to Kafka: librdkafka stays out of their process.
    probe = f"import sys, {module}; print('confluent_kafka' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert loaded.stdout.strip() == "False"


TASK = str(uuid.uuid4())


@pytest.mark.parametrize(
    "args",
    [
        ("tasks", "list", "--limit", "-5"),  # reached the database (2201W, exit 1)
        ("tasks", "list", "--limit", "0"),
        ("tasks", "list", "--limit", "10001"),
        ("tasks", "list", "--limit", "lots"),
        ("tasks", "list", "--status", "Done"),
        ("tasks", "list", "--role", "sales"),
        ("tasks", "show", TASK, "--watch", "--interval", "5"),  # a duration needs its unit
        ("tasks", "show", TASK, "--watch", "--interval", "1ms"),
        ("tasks", "show", TASK, "--watch", "--interval", "99999999999d"),
        ("tasks", "show", TASK, "--watch", "--interval", "soon"),
        ("outbox", "quarantine", "list", "--limit", "-1"),
        ("outbox", "quarantine", "show", "0"),
        ("roles", "show", "not-a-uuid"),
        ("roles", "set-permissions", "not-a-uuid", "docs.read"),
        ("memberships", "join", str(uuid.uuid4())),
        ("memberships", "leave", str(uuid.uuid4()), str(uuid.uuid4())),
        ("tasks",),
        ("nonsense",),
    ],
)
def test_every_argument_is_checked_by_the_parser_in_one_line(args: tuple[str, ...]) -> None:
    result = run(*args, env={"IDENTITY_FANOUT_DATABASE_DSN": "host=127.0.0.1 port=1"})
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()  # no usage block above it
    assert line.startswith("identity-fanout"), line
    assert ": error: " in line, line
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("status", ["failed", "FAILED", "Failed", "inprogress"])
def test_a_status_is_taken_in_any_case(status: str) -> None:
    # Parsed, then the (unreachable) database is the only thing that stops it: exit 1.
    result = run(
        "tasks",
        "list",
        "--status",
        status,
        env={"IDENTITY_FANOUT_DATABASE_DSN": "host=127.0.0.1 port=1"},
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: database unavailable:")


def test_an_empty_permission_set_without_allow_empty_is_refused_before_connecting() -> None:
    role = str(uuid.uuid4())
    result = run(
        "roles",
        "set-permissions",
        role,
        env={"IDENTITY_FANOUT_DATABASE_DSN": "host=127.0.0.1 port=1"},
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: no PERMISSION_CODE given")
    assert "--allow-empty" in line


UNREACHABLE_BOUND_SECONDS = 15.0
"""CONNECT_TIMEOUT (5 s) for the one address, plus the interpreter's start, with room."""


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes the TCP connection and never answers: a server that hangs (or a
    host behind a firewall that drops the reply), as libpq meets it."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield server.getsockname()[1]


@pytest.mark.parametrize(
    "args",
    [("status",), ("tasks", "list"), ("roles", "show", str(uuid.uuid4())), ("outbox", "status")],
)
def test_an_unreachable_database_is_one_line_within_the_bound(
    args: tuple[str, ...], silent_port: int
) -> None:
    # libpq waited for the server's first byte for as long as the kernel kept the
    # connection: the command never answered.
    dsn = f"host=127.0.0.1 port={silent_port} dbname=x user=x sslmode=disable"
    started = time.monotonic()
    result = run(*args, env={"IDENTITY_FANOUT_DATABASE_DSN": dsn})
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: database unavailable:"), line
    assert elapsed < UNREACHABLE_BOUND_SECONDS, elapsed
