"""The operator listings in an 80-column terminal (`make demo`, a plain shell) and a wide one."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec
import pytest
from rich.console import Console, RenderableType

from identity_fanout.fanout.queue import FanOutShard, FanOutTask
from identity_fanout.fanout.shards import START
from identity_fanout.ops.outbox import OutboxStatus, RelayHolder, open_writers, status_table
from identity_fanout.ops.quarantine import quarantine_detail, quarantine_table
from identity_fanout.ops.tasks import shards_table, tasks_table
from identity_fanout.outbox.quarantine import QuarantinedRow
from identity_fanout.outbox.store import OpenWriterRow

AT = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
TASK, ROLE, KEY, CURSOR = (uuid.uuid4() for _ in range(4))


def render(renderable: RenderableType, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def task(
    last_error: str | None = "OperationalError: connection to the database was lost",
) -> FanOutTask:
    return FanOutTask(
        id=TASK,
        role_id=ROLE,
        company_id=None,
        role_version=3,
        reason="RolePermissionsChanged",
        status="Failed",
        cursor=None,
        processed_count=500,
        attempt_count=5,
        lease_expires_at=AT,
        last_error=last_error,
        created_at=AT,
        started_at=AT,
        completed_at=None,
        updated_at=AT,
        shard_count=2,
        user_count=50_000,
        role_code="sales-managers",
    )


def shard() -> FanOutShard:
    return FanOutShard(
        id=uuid.uuid4(),
        task_id=TASK,
        shard_no=1,
        lower_bound=START,
        upper_bound=KEY,
        status="InProgress",
        cursor=CURSOR,
        processed_count=1000,
        attempt_count=1,
        lease_expires_at=AT,
        last_error=None,
        started_at=AT,
        completed_at=None,
        updated_at=AT,
    )


def quarantined() -> QuarantinedRow:
    return QuarantinedRow(
        id=7,
        outbox_id=1234,
        topic="pin.identity.access.v1",
        key=str(KEY),
        message_id=uuid.uuid4(),
        event_type="UserAccessChanged",
        created_at=AT,
        error_code="MSG_SIZE_TOO_LARGE",
        error_reason="too-large",
        error_message="Broker: Message size too large",
        attempts=1,
        first_failed_at=AT,
        last_failed_at=AT,
        size=9_000_000,
        headers=(),
    )


def status() -> OutboxStatus:
    holder = RelayHolder(
        pid=4242,
        application_name="identity-fanout-relay@relay-7c9f8d6b5-x2x9q",
        client_addr="10.42.0.17",
        lanes=(0, 1, 2, 3, 4, 5, 6, 7),
    )
    return OutboxStatus(
        backlog=12,
        oldest_created_at=AT,
        oldest_age_seconds=3.5,
        by_topic={"pin.identity.access.v1": 12},
        relay_active=True,
        relay=holder,
        holders=(holder,),
        instances=1,
        quarantined={"pin.identity.access.v1": 1},
    )


Build = Callable[[], RenderableType]
LISTINGS: dict[str, tuple[Build, tuple[str, str], tuple[str, str]]] = {
    "tasks list": (lambda: tasks_table([task()]), ("id", str(TASK)), ("role id", str(ROLE))),
    "shards": (lambda: shards_table([shard()]), ("up to", str(KEY)), ("cursor", str(CURSOR))),
    "quarantine list": (
        lambda: quarantine_table([quarantined()]),
        ("key", str(KEY)),
        ("message", "Broker: Message size too large"),
    ),
}


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_a_listing_is_one_block_per_row_at_80_columns(name: str) -> None:
    build, *fields = LISTINGS[name]
    lines = render(build(), 80)
    assert all(len(line) <= 80 for line in lines), lines
    for field, value in fields:
        # The whole value on the field's line: an id is never folded over lines.
        assert any(line.startswith(f"{field}:") and line.endswith(f" {value}") for line in lines)


@pytest.mark.parametrize(
    ("build", "width", "first", "second"),
    [
        (lambda: shards_table([shard()]), 200, str(KEY), str(CURSOR)),
        (lambda: tasks_table([task(last_error=None)]), 230, str(TASK), str(ROLE)),
        (lambda: tasks_table([task()]), 280, str(TASK), "connection to the database was lost"),
        (lambda: quarantine_table([quarantined()]), 250, str(KEY), "Broker: Message size too"),
    ],
    ids=["shards", "tasks list", "tasks list with an error", "quarantine list"],
)
def test_a_listing_that_fits_is_a_table_one_line_per_row(
    build: Build, width: int, first: str, second: str
) -> None:
    lines = render(build(), width)
    assert all(len(line) <= width for line in lines)
    row = [line for line in lines if first in line]
    assert len(row) == 1
    assert second in row[0]
    assert not any(": " + first in line for line in lines)


def test_outbox_status_reads_at_80_and_200_columns() -> None:
    narrow = render(status_table(status()), 80)
    assert all(len(line) <= 80 for line in narrow)
    assert "quarantined pin.identity.access.v1: 1 (outbox quarantine list)" in narrow
    assert any(line.startswith("relay session pid 4242:") for line in narrow)
    wide = render(status_table(status()), 200)
    holder = [line for line in wide if "relay session pid 4242" in line]
    assert len(holder) == 1
    assert "identity-fanout-relay@relay-7c9f8d6b5-x2x9q from 10.42.0.17" in holder[0]


def test_a_missing_value_is_one_symbol_in_every_table() -> None:
    # None, empty and "-" were three ways of saying "none" in these tables.
    blank = task(last_error=None)
    lines = render(tasks_table([blank]), 300)
    [row] = [line for line in lines if str(TASK) in line]
    assert "None" not in row
    assert row.rstrip(" │").endswith("-")  # the last error: none
    unset = msgspec.structs.replace(quarantined(), headers=(("traceparent", None),))
    detail = render(quarantine_detail(unset), 200)
    [header] = [line for line in detail if "header traceparent" in line]
    assert header.rstrip(" │").endswith(" -")  # a header without a value: was empty


def test_open_writers_show_their_lanes_and_are_marked_once_open_long() -> None:
    rows = [
        OpenWriterRow([9, 17], None, "fix-42", None, "dba", "prepared", AT, 754.2),
        OpenWriterRow([5], 4242, None, "psql", "alice", "idle in transaction", AT, 3.0),
        OpenWriterRow([5, 13, 21], 4343, None, "psql", "bob", None, None, None),
    ]
    prepared, short, hidden = open_writers(rows, lanes=8)
    assert (prepared.lanes, prepared.long_open, prepared.open_seconds) == ((1,), True, 754.2)
    assert (short.lanes, short.long_open) == ((5,), False)
    assert (hidden.lanes, hidden.long_open, hidden.open_seconds) == ((5,), None, None)
    assert open_writers(rows, lanes=4)[0].lanes == (1,)
    assert open_writers(rows, lanes=2)[2].lanes == (1,)

    shown = msgspec.structs.replace(status(), open_writers=(prepared, short, hidden))
    lines = render(status_table(shown), 250)
    [first] = [line for line in lines if "prepared writer fix-42" in line]
    assert "slots 9, 17 (lanes 1): dba, prepared 12m34s ago (over 10s: rows of these" in first
    assert "COMMIT PREPARED or ROLLBACK PREPARED" in first
    [second] = [line for line in lines if "open writer pid 4242" in line]
    assert "slots 5 (lanes 5): alice as psql, idle in transaction, open 3.0s" in second
    assert "over" not in second
    [third] = [line for line in lines if "open writer pid 4343" in line]
    assert "bob as psql, state unknown, open unknown (pg_read_all_stats shows them)" in third
    assert "None" not in "".join(lines)
    narrow = render(status_table(shown), 80)
    assert all(len(line) <= 80 for line in narrow)
    assert any(line.startswith("open writer pid 4242:") for line in narrow)
