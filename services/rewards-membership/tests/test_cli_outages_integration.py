"""The operator's commands with Kafka or PostgreSQL down: an answer within seconds (`WAITED`),
what the other dependency can still say on stdout, one line on stderr saying what could not
be reached, exit 1 (docs/design/rewards-membership.md "When a dependency is down").

Each command runs as an operator runs it, `rewards-membership ...` in a process of its own,
the dependency that is down being a loopback port nothing listens on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from psycopg.conninfo import conninfo_to_dict

from rewards_membership.ops.brokers import KAFKA_WAIT
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration

Sql = Callable[..., list[tuple[Any, ...]]]

WAITED = KAFKA_WAIT + 2.0
"""Seconds a command may take beyond the process's start (`started`, the interpreter and
its imports: under a second on an idle machine, several on one shared with other test
runs) when a dependency refuses connections: Kafka is waited for `KAFKA_WAIT`, a refused
database connect fails at once; the other dependency's answer and the clients' closing
take well under a second on an idle machine, the rest is margin for a loaded one. The
design notes promise 5 s in all on an idle machine."""
LONGEST = 15.0
"""Seconds no answer may take, however loaded the machine (it took 26 s with Kafka down)."""


def closed_port() -> int:
    """A loopback port nothing listens on (taken from the kernel, then let go)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def started() -> float:
    """Seconds `rewards-membership --version` takes here: the process's start, the same
    imports as every command's, nothing waited for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDS_MEMBERSHIP_")}
    return sum(run(env, "--version")[1] for _ in range(2)) / 2


def environment(settings: Settings, dsn: str, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDS_MEMBERSHIP_")}
    return env | {
        "REWARDS_MEMBERSHIP_DATABASE_DSN": dsn,
        "REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "REWARDS_MEMBERSHIP_TOPIC": settings.topic,
        "REWARDS_MEMBERSHIP_DLQ_TOPIC": settings.dlq_topic,
        "REWARDS_MEMBERSHIP_GROUP_ID": settings.group_id,
        "COLUMNS": "400",
        **overrides,
    }


def run(env: dict[str, str], *argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("rewards-membership")), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, time.monotonic() - started


def within_bound(took: float, started: float) -> None:
    assert took < LONGEST, f"{took:.1f}s"
    assert took - started < WAITED, f"{took:.1f}s, {started:.1f}s of it the process's start"


def unavailable(
    done: subprocess.CompletedProcess[str], took: float, dependency: str, started: float
) -> None:
    """Exit 1 within the bound, ONE line on stderr naming what could not be reached (no
    traceback, no line per client error)."""
    within_bound(took, started)
    assert done.returncode == 1, done.stderr + done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {dependency} unavailable: "), lines[0]
    assert "Traceback" not in done.stdout + done.stderr


def test_with_kafka_down_each_command_answers_in_seconds_with_the_databases_part(
    settings: Settings, operator_dsn: str, sql: Sql, started: float
) -> None:
    # Was: `status` 26 s, hundreds of `kafka client error` lines, then a traceback and
    # nothing of the dead letters the database knows; `dlq list` the same.
    message_id = uuid.uuid4()
    keys = (
        f"rewards:identity-membership:{message_id}",
        f"rewards:identity-membership:at:{settings.topic}:2:17",
    )
    for key in keys:
        sql(
            "INSERT INTO rewards.inbox (idempotency_key, outcome) VALUES (%(k)s, 'dead-lettered')",
            {"k": key},
        )
    bootstrap = f"127.0.0.1:{closed_port()}"
    env = environment(settings, operator_dsn, REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP=bootstrap)

    done, took = run(env, "status")
    unavailable(done, took, "kafka", started)
    assert bootstrap in done.stderr
    assert "2 on " in done.stdout  # the dead letters pending, from the database
    assert "- (kafka unavailable)" in done.stdout
    done, took = run(env, "status", "--json")
    unavailable(done, took, "kafka", started)
    shown = msgspec.json.decode(done.stdout)
    assert shown["dead_letters_pending"] == 2
    assert (shown["lag_records"], shown["partitions"], shown["paused"]) == (None, None, None)
    assert list(shown["unavailable"]) == ["kafka"]

    # `dlq list`: the dead letters pending by the database's marks.
    done, took = run(env, "dlq", "list")
    unavailable(done, took, "kafka", started)
    assert str(message_id) in done.stdout
    assert f"{settings.topic}[2]@17" in done.stdout
    assert "2 dead letter(s) pending" in done.stdout
    done, took = run(env, "dlq", "list", "--json")
    unavailable(done, took, "kafka", started)
    marks = [msgspec.json.decode(line) for line in done.stdout.splitlines()]
    assert sorted(m["idempotency_key"] for m in marks) == sorted(keys)
    assert {(m["message_id"], m["original"]) for m in marks} == {
        (str(message_id), None),
        (None, f"{settings.topic}[2]@17"),
    }
    assert all(m["state"] == "pending" for m in marks)

    # The changes need both: refused in one line, nothing changed.
    for argv in (
        ["dlq", "replay", "--all"],
        ["dlq", "replay", "--offset", "0", "--partition", "0", "--json"],
        ["dlq", "resolve", "--all", "--reason", "drill"],
    ):
        done, took = run(env, *argv)
        unavailable(done, took, "kafka", started)
        assert done.stdout == ""
    assert sql("SELECT count(*) FROM rewards.inbox WHERE outcome = 'dead-lettered'") == [(2,)]


def test_with_the_database_down_status_and_dlq_list_show_what_kafka_answers(
    settings: Settings, operator_dsn: str, kafka: Any, started: float
) -> None:
    # A record on the DLQ without DLQ headers: no code, no original place.
    kafka.producer.produce(settings.dlq_topic, key=b"k", value=b"v", partition=0)
    assert kafka.producer.flush(10) == 0
    options = conninfo_to_dict(operator_dsn) | {"host": "127.0.0.1", "port": str(closed_port())}
    down = " ".join(f"{k}={v}" for k, v in options.items())
    env = environment(settings, down)

    done, took = run(env, "status")
    unavailable(done, took, "database", started)
    assert "- (database unavailable)" in done.stdout
    assert "partitions" in done.stdout  # the lag, from the brokers
    done, took = run(env, "status", "--json")
    unavailable(done, took, "database", started)
    shown = msgspec.json.decode(done.stdout)
    assert shown["dead_letters_pending"] is None
    assert [p["partition"] for p in shown["partitions"]] == [0, 1, 2]
    assert list(shown["unavailable"]) == ["postgresql"]

    done, took = run(env, "dlq", "list")
    unavailable(done, took, "database", started)
    [row] = [line.split() for line in done.stdout.splitlines() if line.startswith("0@0")]
    assert row[1:5] == ["-", "-", "k", "-"]  # state, code, key, original
    assert "None" not in done.stdout
    assert "1 record(s), their states unknown (database unavailable)" in done.stdout
    done, took = run(env, "dlq", "list", "--json")
    unavailable(done, took, "database", started)
    [listed] = [msgspec.json.decode(line) for line in done.stdout.splitlines()]
    assert (listed["partition"], listed["offset"], listed["state"]) == (0, 0, None)
    assert listed["code"] is None

    for argv in (
        ["dlq", "replay", "--all"],
        ["dlq", "resolve", "--all", "--reason", "drill"],
        ["agent", "show", str(uuid.uuid4())],
        ["inbox", "prune", "--older-than", "30d"],
    ):
        done, took = run(env, *argv)
        unavailable(done, took, "database", started)
        assert done.stdout == ""


def test_a_partition_the_dlq_topic_does_not_have_is_one_line_exit_1(
    settings: Settings, operator_dsn: str, started: float
) -> None:
    # Was: a traceback ending in `_UNKNOWN_PARTITION`.
    env = environment(settings, operator_dsn)
    for argv in (
        ["dlq", "replay", "--offset", "0", "--partition", "9"],
        ["dlq", "resolve", "--offset", "0", "--partition", "7", "--reason", "drill"],
    ):
        done, took = run(env, *argv)
        within_bound(took, started)
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.splitlines()
        partition = argv[argv.index("--partition") + 1]
        assert line == (
            f"error: --partition {partition}: the DLQ topic {settings.dlq_topic} has no such"
            " partition (it has 0, 1, 2)"
        )
        assert done.stdout == ""
