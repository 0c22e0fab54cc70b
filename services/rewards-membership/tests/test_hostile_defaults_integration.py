"""Every process kind of rewards-membership against a database whose defaults work against
it, as the chart runs them (console scripts, runtime logins).

`DateStyle 'SQL, DMY'` (psycopg parses only ISO), `TimeZone 'Asia/Kathmandu'` (+05:45: a
year-9999 timestamp renders as year 10000), `IntervalStyle iso_8601`, a `search_path` that
finds a decoy schema's `now()` first, and a statement timeout of 1 ms for every runtime
login: each session pins what it relies on (`pin_runtime.postgres.PINNED_SETTINGS`).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from consumer_kit import publish
from psycopg.conninfo import conninfo_to_dict

from pin_runtime.postgres import SessionLimits
from pin_testkit.events import membership_event
from pin_testkit.hostile import make_hostile
from pin_testkit.ports import free_port
from pin_testkit.service import ServiceProcess, run_cli, service_environment
from pin_testkit.waiting import wait_until
from rewards_membership.settings import Settings

pytestmark = pytest.mark.integration


def test_every_process_kind_works_against_hostile_database_defaults(  # noqa: PLR0917 - its fixtures
    database: str,
    consumer_dsn: str,
    operator_dsn: str,
    settings: Settings,
    kafka: Any,
    tmp_path: Path,
) -> None:
    # Was: psycopg refused every timestamp the consumer read back (DateStyle), so no batch
    # could apply, and the operator's commands exited 1 with a traceback.
    logins = [str(conninfo_to_dict(dsn)["user"]) for dsn in (consumer_dsn, operator_dsn)]
    with psycopg.connect(database, autocommit=True) as owner:
        make_hostile(owner, logins)

    def environment(dsn: str, **more: str) -> dict[str, str]:
        """Every process kind's variables as the chart sets them, logged in with `dsn`."""
        return service_environment(
            ("REWARDS_MEMBERSHIP_",),
            REWARDS_MEMBERSHIP_DATABASE_DSN=dsn,
            REWARDS_MEMBERSHIP_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
            REWARDS_MEMBERSHIP_TOPIC=settings.topic,
            REWARDS_MEMBERSHIP_DLQ_TOPIC=settings.dlq_topic,
            REWARDS_MEMBERSHIP_GROUP_ID=settings.group_id,
            **more,
        )

    def cli(dsn: str, *args: str) -> str:
        env = environment(dsn, COLUMNS="300")
        result = run_cli("rewards-membership", args, env, timeout=60, check=False)
        assert result.returncode == 0, (args, result.stderr)
        return result.stdout

    cli(database, "migrate")
    agent, company = uuid.uuid4(), uuid.uuid4()
    # The latest timestamp the wire carries: year 10000 in the session's +05:45.
    left = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    publish(
        kafka.producer,
        settings.topic,
        membership_event(
            agent, company, 1, "Left", reason="SelfLeave", left_at=left, effective_at=left
        ),
        membership_event(uuid.uuid4(), company, 1),
    )
    port = free_port()
    env = environment(
        consumer_dsn,
        REWARDS_MEMBERSHIP_POLL_TIMEOUT="200ms",
        REWARDS_MEMBERSHIP_METRICS_HOST="127.0.0.1",
        REWARDS_MEMBERSHIP_METRICS_PORT=str(port),
    )
    consumer = ServiceProcess(
        "consumer", "rewards-membership", ("consume",), env, port, tmp_path / "consumer.log"
    )
    # The test's own reads pin the same settings (they would fail as the old code did).
    with psycopg.connect(database, autocommit=True, **SessionLimits().connect_kwargs()) as db:
        with consumer.start():
            consumer.wait_ready()
            wait_until(
                lambda: (
                    db.execute("SELECT count(*) FROM rewards.agent_performance").fetchone() == (2,)
                ),
                timeout=60,
                what="both events applied",
                alive=[consumer],
            )
            assert consumer.metric("rewards_identity_membership_dlq_total") == 0
        stored = db.execute(
            "SELECT left_at, effective_at FROM rewards.agent_performance WHERE agent_user_id = %s",
            (agent,),
        ).fetchone()
    assert stored == (left, left)
    shown = msgspec.json.decode(cli(operator_dsn, "agent", "show", str(agent), "--json"))
    assert [row["company_id"] for row in shown["rows"]] == [str(company)]
    cli(operator_dsn, "dlq", "list")
