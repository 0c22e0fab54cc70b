"""The `rewards-membership` command line: config errors, migrate, agent show, inbox, dlq."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pin_contracts import AgentMembershipChanged, envelope_for
from pin_testkit.waiting import wait_until
from rewards_membership.cli import main
from rewards_membership.settings import Settings
from rewards_membership.store import prune_inbox

Event = Callable[..., AgentMembershipChanged]
Sql = Callable[..., list[tuple[Any, ...]]]


def environment(settings: Settings, dsn: str | None = None) -> dict[str, str]:
    """The settings as variables; `dsn` instead of theirs (the tooling's own login)."""
    return {
        "REWARDS_MEMBERSHIP_DATABASE_DSN": dsn or settings.database_dsn.reveal(),
        "REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "REWARDS_MEMBERSHIP_TOPIC": settings.topic,
        "REWARDS_MEMBERSHIP_DLQ_TOPIC": settings.dlq_topic,
        "REWARDS_MEMBERSHIP_GROUP_ID": settings.group_id,
        "REWARDS_MEMBERSHIP_POLL_TIMEOUT": "200ms",
        "REWARDS_MEMBERSHIP_METRICS_PORT": "0",
    }


@pytest.fixture
def cli_environment(monkeypatch: pytest.MonkeyPatch, settings: Settings, operator_dsn: str) -> None:
    """The tool's variables (`environment`, the operator's login), a 400-column terminal."""
    for name, value in environment(settings, operator_dsn).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "400")


def dlq_rows(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """`dlq list --json`: one object per record."""
    capsys.readouterr()
    assert main(["dlq", "list", "--json"]) == 0
    return [msgspec.json.decode(line) for line in capsys.readouterr().out.splitlines()]


def results(
    capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`dlq <argv> --json`: the result of each record, and the totals (the last line)."""
    capsys.readouterr()
    assert main(["dlq", *argv, "--json"]) == 0
    *records, totals = map(msgspec.json.decode, capsys.readouterr().out.splitlines())
    return records, totals


PASSWORD = "n0t-in-any-output"


@pytest.mark.parametrize(
    ("values", "named", "mentioned"),
    [
        # librdkafka's max.poll.interval.ms (24 h at most) is derived from both.
        ({"REWARDS_MEMBERSHIP_DB_STATEMENT_TIMEOUT": "4h"}, "DB_STATEMENT_TIMEOUT", "DELIVERY"),
        ({"REWARDS_MEMBERSHIP_DELIVERY_TIMEOUT": "30d"}, "DELIVERY_TIMEOUT", ""),
        ({"REWARDS_MEMBERSHIP_DB_STATEMENT_TIMEOUT": "30d"}, "DB_STATEMENT_TIMEOUT", ""),
        ({"REWARDS_MEMBERSHIP_DB_STATEMENT_TIMEOUT": "99999999999d"}, "DB_STATEMENT_TIMEOUT", ""),
        (
            {"REWARDS_MEMBERSHIP_RETRY_INITIAL": "5s", "REWARDS_MEMBERSHIP_RETRY_MAX": "1s"},
            "RETRY_MAX",
            "REWARDS_MEMBERSHIP_RETRY_INITIAL",
        ),
        (
            {"REWARDS_MEMBERSHIP_DATABASE_DSN": f"port=notaport password={PASSWORD}"},
            "DATABASE_DSN",
            "",
        ),
        (
            {"REWARDS_MEMBERSHIP_DATABASE_DSN": f"sslmodee=require password={PASSWORD}"},
            "DATABASE_DSN",
            "",
        ),
        ({"REWARDS_MEMBERSHIP_TOPIC": "not a topic"}, "TOPIC", ""),
    ],
)
def test_a_value_its_consumer_would_refuse_stops_consume_at_start(
    values: dict[str, str], named: str, mentioned: str
) -> None:
    # Was: exit 1, nothing on stderr, a traceback on stdout (or one variable of two named).
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDS_MEMBERSHIP_")}
    env |= {
        "REWARDS_MEMBERSHIP_DATABASE_DSN": f"host=127.0.0.1 port=1 password={PASSWORD}",
        "REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        "REWARDS_MEMBERSHIP_METRICS_PORT": "0",
        **values,
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("rewards-membership")), "consume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("config error: REWARDS_MEMBERSHIP_" + named + ": "), lines[0]
    assert mentioned in lines[0]
    assert PASSWORD not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.integration
@pytest.mark.parametrize("command", [["consume"], ["status"]])
def test_a_login_the_database_refuses_exits_2_naming_the_dsn_variable(
    settings: Settings, command: list[str]
) -> None:
    # Was: exit 1 "database unavailable" (status), or retried for ever (consume), as if
    # the server were down, where a refused Kafka login exits 2.
    dsn = conninfo_to_dict(settings.database_dsn.reveal())
    refused = " ".join(
        f"{k}={v}" for k, v in {**dsn, "user": f"nobody_{uuid.uuid4().hex[:8]}"}.items()
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDS_MEMBERSHIP_")}
    env |= environment(settings, refused) | {"REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("rewards-membership")), *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr + done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: REWARDS_MEMBERSHIP_DATABASE_DSN: "), last
    assert "28000" in last
    assert "Traceback" not in done.stderr + done.stdout


def test_bad_setting_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REWARDS_MEMBERSHIP_DATABASE_DSN", "postgresql://x/y")
    monkeypatch.setenv("REWARDS_MEMBERSHIP_BATCH_SIZE", "lots")
    with pytest.raises(SystemExit) as exit_info:
        main(["migrate"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("config error: REWARDS_MEMBERSHIP_BATCH_SIZE:")


def test_missing_dsn_and_kafka_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REWARDS_MEMBERSHIP_DATABASE_DSN", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["migrate"])
    assert exit_info.value.code == 2
    assert "REWARDS_MEMBERSHIP_DATABASE_DSN" in capsys.readouterr().err
    monkeypatch.setenv("REWARDS_MEMBERSHIP_DATABASE_DSN", "postgresql://x/y")
    monkeypatch.delenv("REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["consume"])
    assert exit_info.value.code == 2
    assert "REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP" in capsys.readouterr().err


def test_version_is_one_line_on_stdout() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDS_MEMBERSHIP_")}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("rewards-membership")), "--version"],
        env=env | {"PIN_BUILD_REVISION": "abc1234"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    [line] = done.stdout.splitlines()
    version = importlib.metadata.version("rewards-membership")
    assert line.startswith(f"rewards-membership {version} (revision abc1234, pin-contracts "), line


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "replay"],
        ["dlq", "replay", "--all", "--offset", "1"],
        ["inbox", "prune", "--older-than", "soon"],
        ["agent", "show", "not-a-uuid"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


@pytest.mark.parametrize(
    ("argv", "named", "why"),
    [
        (["dlq", "replay", "--offset", "-1"], "--offset", "out of range: from 0"),
        (
            ["dlq", "resolve", "--offset", "1", "--partition", "-1", "--reason", "x"],
            "--partition",
            "out of range",
        ),
        (["dlq", "replay", "--offset", str(2**63)], "--offset", "out of range"),
        (["dlq", "list", "--limit", "-5"], "--limit", "out of range: from 1"),
        (["dlq", "list", "--limit", "0"], "--limit", "out of range: from 1"),
        (["dlq", "list", "--limit", "ten"], "--limit", "not a whole number"),
        # A bare number was taken as seconds: every mark older than 5 s would go.
        (["inbox", "prune", "--older-than", "5"], "--older-than", "has no unit"),
        (["inbox", "prune", "--older-than", "30m"], "--older-than", "from 1h to 3650d"),
        (["inbox", "prune", "--older-than", "3651d"], "--older-than", "from 1h to 3650d"),
        # Was: OverflowError (the cut-off before year 1), a traceback.
        (["inbox", "prune", "--older-than", "1000000d"], "--older-than", "out of range"),
        (["inbox", "prune", "--older-than", "99999999999999d"], "--older-than", "not a duration"),
    ],
)
def test_an_argument_out_of_its_range_is_refused_by_the_parser(
    argv: list[str], named: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: argument {named}: " in last, last
    assert why in last, last


@pytest.mark.integration
def test_agent_show_of_an_agent_the_projection_never_saw_is_not_found(
    settings: Settings, operator_dsn: str
) -> None:
    # Was: "independent", exit 0, as for an agent whose every membership ended.
    agent = uuid.uuid4()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDS_MEMBERSHIP_")}
    env |= environment(settings, operator_dsn)
    script = str(Path(sys.executable).with_name("rewards-membership"))

    def show(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [script, "agent", "show", str(agent), *options],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = show()
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: agent {agent} not found: the projection has no row of it"
    ]
    done = show("--json")
    assert done.returncode == 1, done.stderr
    assert msgspec.json.decode(done.stdout) == {
        "agent_user_id": str(agent),
        "found": False,
        "display_status": None,
        "rows": [],
    }
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.integration
def test_migrate_is_idempotent(
    fresh_database: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REWARDS_MEMBERSHIP_DATABASE_DSN", fresh_database)
    assert main(["migrate", "--json"]) == 0
    first = msgspec.json.decode(capsys.readouterr().out)
    assert first["applied"]
    assert main(["migrate", "--json"]) == 0
    assert msgspec.json.decode(capsys.readouterr().out) == {"applied": []}


@pytest.mark.integration
def test_agent_show_and_inbox_prune(
    sql: Sql,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cli_environment: None,
) -> None:
    agent, agency_a, agency_b = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for company, status in ((agency_a, "Left"), (agency_b, "Active")):
        sql(
            "INSERT INTO rewards.agent_performance (agent_user_id, company_id, membership_status)"
            " VALUES (%(a)s, %(c)s, %(s)s)",
            {"a": agent, "c": company, "s": status},
        )
    sql(
        "INSERT INTO rewards.inbox (idempotency_key, outcome, processed_at) VALUES"
        " ('rewards:identity-membership:old', 'membership-applied', now() - interval '40 days'),"
        " ('rewards:identity-membership:new', 'membership-applied', now())"
    )
    # For scripts: one JSON object, the rows and the derived status.
    assert main(["agent", "show", str(agent), "--json"]) == 0
    shown = msgspec.json.decode(capsys.readouterr().out)
    assert (shown["found"], shown["display_status"]) == (True, f"in agency {agency_b}")
    assert sorted((r["company_id"], r["membership_status"]) for r in shown["rows"]) == sorted(
        [(str(agency_a), "Left"), (str(agency_b), "Active")]
    )
    # An 80-column terminal (`make demo`): one `field: value` block per row, nothing folded.
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["agent", "show", str(agent)]) == 0
    narrow = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert all(len(line) <= 80 for line in narrow)
    # The title (90 characters) wraps at a space; each row is a block of its own.
    assert " ".join(narrow[:2]) == f"agent {agent}: in agency {agency_b}"
    for company, status in ((agency_a, "Left"), (agency_b, "Active")):
        assert f"company_id:                {company}" in narrow
        assert f"membership_status:         {status}" in narrow
    # A missing value is `-`, as in every table of the tools (never `None`, never blank).
    assert "leave_reason:              -" in narrow
    assert not any("None" in line for line in narrow)
    monkeypatch.setenv("COLUMNS", "400")

    # A dry run counts what the prune would delete (the same statement, rolled back).
    assert main(["inbox", "prune", "--older-than", "30d", "--dry-run", "--json"]) == 0
    preview = msgspec.json.decode(capsys.readouterr().out)
    assert (preview["deleted"], preview["dry_run"]) == (1, True)
    assert main(["inbox", "prune", "--older-than", "30d", "--dry-run"]) == 0
    previewed = capsys.readouterr()
    assert previewed.out == "1 mark(s) would be deleted (dry run: nothing deleted)\n"
    assert "inbox pruned" not in previewed.err  # no audit line: nothing changed
    assert len(sql("SELECT 1 FROM rewards.inbox")) == 2
    assert main(["inbox", "prune", "--older-than", "30d", "--json"]) == 0
    pruned = msgspec.json.decode(capsys.readouterr().out)
    assert (pruned["deleted"], pruned["dry_run"]) == (1, False)
    assert sql("SELECT idempotency_key FROM rewards.inbox") == [
        ("rewards:identity-membership:new",)
    ]


@pytest.mark.integration
def test_a_dry_run_of_inbox_prune_counts_across_its_chunks_and_deletes_nothing(
    sql: Sql, operator_dsn: str
) -> None:
    sql(
        "INSERT INTO rewards.inbox (idempotency_key, outcome, processed_at)"
        " SELECT 'rewards:identity-membership:' || n, 'membership-applied',"
        " now() - interval '40 days' FROM generate_series(1, 5) AS n"
    )
    sql(
        "INSERT INTO rewards.inbox (idempotency_key, outcome, processed_at)"
        " VALUES ('rewards:identity-membership:dead', 'dead-lettered', now() - interval '40 days')"
    )
    cut = timedelta(days=30)
    # Chunks of 2: each chunk's rollback alone would find the same marks again.
    with psycopg.connect(operator_dsn, autocommit=True) as conn:
        assert prune_inbox(conn, cut, now=datetime.now(UTC), chunk=2, dry_run=True) == 5
        assert len(sql("SELECT 1 FROM rewards.inbox")) == 6
        assert prune_inbox(conn, cut, now=datetime.now(UTC), chunk=2) == 5
    assert sql("SELECT outcome FROM rewards.inbox") == [("dead-lettered",)]


@pytest.mark.integration
def test_dlq_list_and_replay(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cli_environment: None,
) -> None:
    agent = uuid.uuid4()
    consumer = start_consumer()
    kafka.send(event(agent, uuid.UUID(int=0), 1, membership_id=uuid.uuid4()))
    kafka.send_raw((str(agent).encode(), b"garbage", None))
    consumer.wait_handled(2)
    rows = dlq_rows(capsys)
    assert [(r["state"], r["code"], r["key"]) for r in rows] == [
        ("pending", "REWARDS_MEMBERSHIP_EVENT_INVALID", str(agent))
    ] * 2
    assert any("$.Payload.CompanyId" in r["reason"] for r in rows)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["dlq", "list"]) == 0
    narrow = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert all(len(line) <= 80 for line in narrow)
    assert (
        sum(line.startswith("code:     REWARDS_MEMBERSHIP_EVENT_INVALID") for line in narrow) == 2
    )
    assert f"key:      {agent}" in narrow
    monkeypatch.setenv("COLUMNS", "400")

    # Both would fail validation again on the same bytes: refused, nothing sent.
    refused, totals = results(capsys, "replay", "--all")
    assert [r["result"] for r in refused] == ["refused"] * 2
    assert all(r["detail"].startswith("still invalid: ") for r in refused)
    assert (totals["records"], totals["results"]["refused"], totals["dry_run"]) == (2, 2, False)
    assert consumer.total("rewards_identity_membership_dlq_total") == 2

    # A dry run of the forced replay: both would go to the source topic, nothing is sent
    # (the replay below still finds both unreplayed).
    preview, totals = results(capsys, "replay", "--all", "--force", "--dry-run")
    assert [(r["result"], r["target_topic"]) for r in preview] == [
        ("would-replay", kafka.topic)
    ] * 2
    assert (totals["results"]["would-replay"], totals["results"]["replayed"]) == (2, 0)
    assert totals["dry_run"] is True

    # --force replays them anyway: the consumer processes them (not duplicates) and they
    # come back to the DLQ. Replayed records are not replayed again.
    replayed, _ = results(capsys, "replay", "--all", "--force")
    assert [(r["result"], r["target_topic"]) for r in replayed] == [("replayed", kafka.topic)] * 2
    assert all(r["target_offset"] is not None for r in replayed)
    consumer.wait_handled(4)
    assert consumer.total("rewards_identity_membership_dlq_total") == 4
    assert consumer.total("rewards_membership_skipped_duplicate_total") == 0
    again, _ = results(capsys, "replay", "--all", "--force")
    assert sum(r["result"] == "already-replayed" for r in again) == 2
    assert all(r["detail"].startswith("at ") for r in again if r["result"] == "already-replayed")
    consumer.wait_handled(6)
    assert consumer.total("rewards_identity_membership_dlq_total") == 6
    rows = dlq_rows(capsys)
    assert len(rows) == 6
    assert sum(r["state"] == "pending" for r in rows) == 2


@pytest.mark.integration
def test_dlq_resolve_closes_dead_letters_without_a_replay(  # noqa: PLR0915 - one session
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    capsys: pytest.CaptureFixture[str],
    operator_dsn: str,
    sql: Sql,
    cli_environment: None,
) -> None:
    agent = uuid.uuid4()
    consumer = start_consumer()
    # One dead letter keyed by its MessageId (a missing CompanyId), one by its position.
    invalid = kafka.send(event(agent, uuid.UUID(int=0), 1, membership_id=uuid.uuid4()))[0]
    kafka.send_raw((str(agent).encode(), b"garbage", None))
    consumer.wait_handled(2)
    gauge = "rewards_identity_membership_dlq_unreplayed"
    wait_until(lambda: consumer.value(gauge) == 2, timeout=30, what="2 unreplayed dead letters")
    pending = next(r for r in dlq_rows(capsys) if r["state"] == "pending")
    partition, offset = str(pending["partition"]), str(pending["offset"])

    with pytest.raises(SystemExit) as blank:
        main(["dlq", "resolve", "--all", "--reason", "  "])
    assert blank.value.code == 2
    assert "a reason must say something" in capsys.readouterr().err

    # A dry run names both and closes neither: no audit line, and both resolve for real below.
    # What an operator reads (the text lines) is checked here; the rest reads `--json`.
    assert main(["dlq", "resolve", "--all", "--reason", "drill", "--dry-run"]) == 0
    previewed = capsys.readouterr()
    preview = previewed.out.splitlines()
    assert sorted(line.split(": ")[1] for line in preview if "@" in line) == ["would-resolve"] * 2
    assert preview[-1] == "2 record(s) would be resolved (dry run: nothing written)"
    assert "dlq resolved" not in previewed.err
    dry, totals = results(capsys, "resolve", "--all", "--reason", "drill", "--dry-run")
    assert [r["result"] for r in dry] == ["would-resolve"] * 2
    assert (totals["results"]["would-resolve"], totals["dry_run"]) == (2, True)

    argv = ["resolve", "--offset", offset, "--partition", partition, "--reason", "bug"]
    assert main(["dlq", *argv, "--json"]) == 0
    done = capsys.readouterr()
    [closed, totals] = [msgspec.json.decode(line) for line in done.out.splitlines()]
    assert (closed["partition"], closed["offset"]) == (int(partition), int(offset))
    assert (closed["result"], closed["detail"]) == ("resolved", "its dead-letter mark closed")
    assert (totals["records"], totals["results"]["resolved"]) == (1, 1)
    # The audit line (the log, on stderr): what was closed, and why.
    logged = [msgspec.json.decode(line) for line in done.err.splitlines() if line[:1] == "{"]
    [audit] = [line for line in logged if line["event"] == "dlq resolved"]
    assert (audit["records"], audit["reason"]) == (1, "bug")
    closed_all, _ = results(capsys, "resolve", "--all", "--reason", "producer fixed, facts re-sent")
    assert sorted(r["result"] for r in closed_all) == ["already-resolved", "resolved"]
    [earlier] = [r for r in closed_all if r["result"] == "already-resolved"]
    assert (earlier["partition"], earlier["offset"]) == (int(partition), int(offset))
    assert earlier["detail"].startswith("at ")
    assert "(bug)" in earlier["detail"]

    # The audit trail names the operator's login and the reasons; both marks are closed.
    trail = sql(
        "SELECT reason, resolved_by, idempotency_key IS NOT NULL FROM rewards.dlq_resolutions"
    )
    assert sorted(r[0] for r in trail) == ["bug", "producer fixed, facts re-sent"]
    assert {r[1] for r in trail} == {conninfo_to_dict(operator_dsn)["user"]}
    assert all(r[2] for r in trail)
    assert sql("SELECT outcome, count(*) FROM rewards.inbox GROUP BY outcome") == [
        ("dead-letter-resolved", 2)
    ]
    wait_until(lambda: consumer.value(gauge) == 0, timeout=30, what="no unreplayed dead letters")

    # Replay skips resolved records; nothing goes out.
    skipped, totals = results(capsys, "replay", "--all")
    assert [r["result"] for r in skipped] == ["resolved"] * 2
    assert all(r["detail"].startswith("at ") for r in skipped)
    assert totals["results"]["replayed"] == 0
    assert main(["dlq", "replay", "--offset", offset, "--partition", partition]) == 1
    capsys.readouterr()
    rows = dlq_rows(capsys)
    assert len(rows) == 2
    assert all(r["state"].startswith("resolved 20") for r in rows)

    # A redelivery of the resolved message is a duplicate, not a second dead letter.
    kafka.send_envelopes(invalid)
    consumer.wait_handled(3)
    assert consumer.total("rewards_membership_skipped_duplicate_total") == 1
    assert consumer.total("rewards_identity_membership_dlq_total") == 2


@pytest.mark.integration
def test_consume_stops_gracefully_on_sigterm(
    settings: Settings, kafka: Any, event: Event, sql: Sql
) -> None:
    agent, company = uuid.uuid4(), uuid.uuid4()
    kafka.send_envelopes(envelope_for(event(agent, company, 1, joined_at=datetime.now(UTC))))
    process = subprocess.Popen(
        [sys.executable, "-m", "rewards_membership.cli", "consume"],
        env={**os.environ, **environment(settings)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def applied() -> bool:
        assert process.poll() is None, process.communicate()
        return bool(sql("SELECT 1 FROM rewards.agent_performance"))

    try:
        wait_until(applied, 60, "the consumer applied the event")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert '"event":"membership-applied"' in out
    assert '"event":"consumer closed"' in out


@pytest.mark.integration
def test_status_shows_the_groups_lag_per_partition_and_the_dead_letters_pending(
    *,
    kafka: Any,
    start_consumer: Any,
    event: Event,
    capsys: pytest.CaptureFixture[str],
    cli_environment: None,
) -> None:
    def status() -> dict[str, Any]:
        assert main(["status", "--json"]) == 0
        # The consumer running in this process logs JSON lines to the same stdout.
        documents: list[dict[str, Any]] = [
            msgspec.json.decode(line) for line in capsys.readouterr().out.splitlines()
        ]
        [shown] = [document for document in documents if "group" in document]
        return shown

    agents = [uuid.uuid4() for _ in range(5)]
    for agent in agents:
        kafka.send(event(agent, uuid.uuid4(), 1, membership_id=uuid.uuid4()))
    kafka.producer.flush(10)
    # No consumer ever ran: every record waits, and ages (what the gauges cannot show).
    waiting = status()
    assert waiting["lag_records"] == 5
    assert waiting["oldest_seconds"] is not None
    assert waiting["oldest_seconds"] >= 0
    assert [p["partition"] for p in waiting["partitions"]] == [0, 1, 2]
    assert all(p["committed"] is None for p in waiting["partitions"])
    assert sum(p["records"] for p in waiting["partitions"]) == 5
    assert waiting["dead_letters_pending"] == 0

    consumer = start_consumer()
    kafka.send_raw((str(agents[0]).encode(), b"garbage", None))
    consumer.wait_handled(6)
    wait_until(lambda: status()["lag_records"] == 0, 30, "the group caught up")
    caught_up = status()
    assert caught_up["oldest_seconds"] is None
    assert caught_up["dead_letters_pending"] == 1
    assert caught_up["paused"] == []  # a paused partition: test_dead_letters.py

    assert main(["status"]) == 0
    screen = capsys.readouterr().out
    for text in (
        "membership consumer",
        "0 record(s)",
        "1 on",
        "(dlq list)",
        "partition",
        "paused partitions",
    ):
        assert text in screen, text


@pytest.mark.integration
@pytest.mark.parametrize("command", [["consume"], ["status"], ["migrate"]])
def test_a_database_password_file_that_gives_no_password_exits_2_naming_it(
    settings: Settings, command: list[str], tmp_path: Path
) -> None:
    missing = tmp_path / "database-password"
    options = conninfo_to_dict(settings.database_dsn.reveal())
    no_password = " ".join(f"{k}={v}" for k, v in options.items() if k != "password")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDS_MEMBERSHIP_")}
    env |= environment(settings, no_password) | {
        "REWARDS_MEMBERSHIP_DATABASE_PASSWORD_FILE": str(missing),
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("rewards-membership")), *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr + done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        f"config error: REWARDS_MEMBERSHIP_DATABASE_PASSWORD_FILE: cannot read {str(missing)!r}:"
        " No such file or directory"
    )
