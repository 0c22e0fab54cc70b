"""A paused relay and its reason in `identity-fanout status` and `outbox status`, read from
the database as an operator reads them, and gone again once the relay resumes."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest
from relay_support import RelayFactory, RelayThread, access_event, access_topic, outbox_count, write

from identity_fanout.outbox.writer import outbox_message
from pin_runtime.kafka import create_admin, ensure_topics
from pin_testkit.service import run_cli, service_environment
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration


def cli(dsn: str, *args: str) -> Any:
    env = service_environment(
        ("IDENTITY_FANOUT_",), IDENTITY_FANOUT_DATABASE_DSN=dsn, COLUMNS="300"
    )
    return run_cli("identity-fanout", list(args), env, timeout=60)


def shown_pauses(dsn: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """`outbox status --json`'s and `status --json`'s paused relays, and the table."""
    outbox = msgspec.json.decode(cli(dsn, "outbox", "status", "--json").stdout)
    system = msgspec.json.decode(cli(dsn, "status", "--json").stdout)
    table = cli(dsn, "outbox", "status").stdout
    return outbox["paused"], system["outbox"]["paused"], table


def test_a_paused_relay_shows_its_reason_in_both_statuses_until_it_resumes(
    identity_dsn: str, kafka_bootstrap: str, make_relay: RelayFactory
) -> None:
    # A topic that does not exist yet: the relay pauses (unknown-topic) and holds its rows.
    topic = access_topic(f"pt.{uuid.uuid4().hex[:8]}")
    write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
    relay = make_relay()
    admin = create_admin(kafka_bootstrap, client_id="pause-status-test")
    with RelayThread(relay):
        wait_until(lambda: relay.pause is not None, 60, "relay paused")
        pid_names: list[Any] = []

        def shown() -> bool:
            outbox, system, table = shown_pauses(identity_dsn)
            pid_names[:] = [outbox, system, table]
            return bool(outbox)

        wait_until(shown, 30, "the pause in outbox status")
        outbox, system, table = pid_names
        [paused] = outbox
        assert system == outbox
        assert paused["reason"] == "unknown-topic"
        assert paused["topic"] == topic.name
        assert paused["application_name"].startswith("identity-fanout-relay@")
        assert "paused" not in paused["application_name"]
        assert f"relay session pid {paused['pid']} paused" in table
        assert f"unknown-topic on {topic.name}" in table

        ensure_topics(admin, [(topic.name, topic.partitions, topic.config())])
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "rows published")
        wait_until(lambda: relay.pause is None, 10, "relay resumed")
        outbox, system, table = shown_pauses(identity_dsn)
        assert (outbox, system) == ([], [])
        assert "paused" not in table
