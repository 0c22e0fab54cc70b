"""The demo's fan-out part: a 20,000-user role changes permissions; every user hears of it."""

from __future__ import annotations

import json
import time
import uuid

import msgspec
import psycopg
from confluent_kafka import Consumer, TopicPartition
from demo_support import Service, console
from rich.table import Table

from identity_fanout.ops.watch import TASK_FAILED_EXIT_CODE
from pin_contracts import Envelope, UserAccessChangedKafkaEvent, decode_access_changed
from pin_contracts.topics import USER_ACCESS_CHANGED
from pin_testkit.seeding import add_permissions, seed_role_with_users

DEMO_USERS = 20_000
TOPIC = USER_ACCESS_CHANGED.name


def high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4()}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in partitions
        }
    finally:
        consumer.close()


def _read_back(
    bootstrap: str, start: dict[int, int], version: int
) -> tuple[int, Envelope[UserAccessChangedKafkaEvent] | None]:
    """Events of this change on the topic (from the offsets before it), and one sample."""
    end = high_watermarks(bootstrap, TOPIC)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"demo-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, o) for p, o in start.items()])
        remaining = sum(end[p] - start[p] for p in start)
        matched, sample = 0, None
        deadline = time.monotonic() + 60
        while remaining > 0 and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=5000, timeout=1.0):
                if message.error() is not None:
                    continue
                remaining -= 1
                event = decode_access_changed(message.value())
                if event.payload.version == version:
                    matched += 1
                    sample = sample or event
        return matched, sample
    finally:
        consumer.close()


def _follow(worker: Service, task_id: str) -> str:
    """The operator's own view of the fan-out (`tasks show --watch`: its bars until the task
    ends), then the outbox until Kafka acknowledged every event of it; the task's status."""
    code = worker.follow("tasks", "show", task_id, "--watch")
    status = {0: "Completed", TASK_FAILED_EXIT_CODE: "Failed"}.get(code, f"watch exit {code}")
    with console.status("events waiting for Kafka") as waiting:
        while True:
            outbox = json.loads(worker.run("outbox", "status", "--json", quiet=True))
            if outbox["backlog"] == 0:
                return status
            waiting.update(f"{outbox['backlog']:,} events waiting for Kafka")
            time.sleep(0.2)  # a person watches: five refreshes a second


def fan_out(worker: Service, dsn: str, bootstrap: str) -> None:
    with console.status(f"seeding a role of {DEMO_USERS:,} users"), psycopg.connect(dsn) as db:
        role, _ = seed_role_with_users(
            db, users=DEMO_USERS, other_roles=2, code=f"demo-{uuid.uuid4().hex[:6]}"
        )
        add_permissions(db, ["deals.read", "deals.approve"])
    before = high_watermarks(bootstrap, TOPIC)
    started = time.monotonic()
    answer = worker.run(
        "roles", "set-permissions", str(role), "deals.read", "deals.approve", "--json"
    )
    change = json.loads(answer)  # --json: the result alone on stdout (the log is on stderr)
    console.print(
        f"role {change['role_id']}: version {change['version']}, {change['mode']}, "
        f"task {change['task_id']}"
    )
    task_id, version = change["task_id"], change["version"]
    status = _follow(worker, task_id)
    elapsed = time.monotonic() - started
    events, sample = _read_back(bootstrap, before, version)

    summary = Table(title="Access fan-out", title_justify="left", show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("value")
    summary.add_row("role", f"{role} (version {version})")
    summary.add_row("task", f"{task_id}: {status}")
    summary.add_row(f"events on {TOPIC}", f"{events:,} (one per user)")
    summary.add_row("commit -> all acknowledged", f"{elapsed:.1f} s")
    summary.add_row("worker metrics", f"http://127.0.0.1:{worker.port}/metrics")
    console.print(summary)
    if sample is not None:
        console.print("one event, as consumers receive it:")
        console.print_json(data=msgspec.to_builtins(sample))
