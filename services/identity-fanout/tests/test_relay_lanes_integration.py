"""Several relay instances share the outbox lanes (real PostgreSQL, real Kafka, a real
`identity-fanout relay` process killed with SIGKILL): take-over, exclusivity, per-key order."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from relay_support import (
    RELAY_TEST_OPTIONS,
    RelayThread,
    access_event,
    access_topic,
    new_relay,
    outbox_count,
)

from identity_fanout.ops.outbox import OutboxStatus, outbox_status
from identity_fanout.outbox.relay import OutboxRelay
from identity_fanout.outbox.rules import SLOTS, lane_of_slot
from identity_fanout.outbox.writer import outbox_message
from identity_fanout.schema import OUTBOX
from pin_contracts import (
    USER_ACCESS_CHANGED,
    AccessChangeReason,
    Topic,
    UserAccessChangedKafkaEvent,
    decode_access_changed,
    envelope_for,
)
from pin_runtime.kafka import create_consumer
from pin_testkit.ports import free_port
from pin_testkit.service import ServiceProcess, service_environment
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

LANES = 8
PROCESS_APP = "identity-fanout-relay@"


def write_versions(dsn: str, topic: Topic, users: list[uuid.UUID], versions: range) -> None:
    """Version `v` of every user, interleaved, one transaction per 100 versions."""
    for start in range(versions.start, versions.stop, 100):
        messages = [
            outbox_message(
                envelope_for(
                    UserAccessChangedKafkaEvent(
                        user_id=user,
                        company_id=user,
                        change_reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED.value,
                        active_assignments=(),
                        version=v,
                    ),
                    correlation_id="lanes-test",
                ),
                topic,
            )
            for v in range(start, min(start + 100, versions.stop))
            for user in users
        ]
        with psycopg.connect(dsn) as conn:
            OUTBOX.write(conn, messages)


def status(dsn: str) -> OutboxStatus:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return outbox_status(conn, OUTBOX, lanes=LANES)


def lanes_of(dsn: str, app_prefix: str) -> set[int]:
    return {
        lane
        for holder in status(dsn).holders
        if (holder.application_name or "").startswith(app_prefix)
        for lane in holder.lanes
    }


def versions_by_user(
    bootstrap: str, topic: str, want: dict[bytes, int], timeout: float = 90
) -> dict[bytes, list[int]]:
    """Versions per key in topic order, read until every key has all its versions."""
    consumer = create_consumer(bootstrap, group_id=f"lanes-{uuid.uuid4().hex[:8]}", client_id="t")
    seen: dict[bytes, list[int]] = defaultdict(list)
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while any(len(set(seen[k])) < n for k, n in want.items()):
            assert time.monotonic() < deadline, {k: len(set(v)) for k, v in seen.items()}
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            version = decode_access_changed(message.value() or b"").payload.version
            seen[message.key() or b""].append(version)
    finally:
        consumer.close()
    return seen


def assert_in_order_but_for_repeated_suffixes(versions: list[int], count: int) -> None:
    """Nothing lost, and no version goes out before an earlier one: a record seen again
    (at-least-once, re-sent from the first unacknowledged row) is only ever a repeat."""
    highest = 0
    for version in versions:
        assert version <= highest + 1, f"version {version} overtook {highest + 1}: {versions}"
        highest = max(highest, version)
    assert highest == count


@pytest.fixture
def relay_process(
    relay_dsn: str, kafka_bootstrap: str, tmp_path: Path
) -> Iterator[Callable[..., ServiceProcess]]:
    """`identity-fanout relay` processes as the chart runs them, logged in as the relay's
    runtime role; stopped after the test whatever their state."""
    started: list[ServiceProcess] = []

    def start(**settings: str) -> ServiceProcess:
        port = free_port()
        env = service_environment(
            IDENTITY_FANOUT_DATABASE_DSN=relay_dsn,
            IDENTITY_FANOUT_KAFKA_BOOTSTRAP=kafka_bootstrap,
            IDENTITY_FANOUT_METRICS_PORT=str(port),
            IDENTITY_FANOUT_METRICS_HOST="127.0.0.1",
            IDENTITY_FANOUT_LOG_LEVEL="WARNING",
            IDENTITY_FANOUT_OUTBOX_LANES=str(LANES),
            **{f"IDENTITY_FANOUT_{k.upper()}": v for k, v in settings.items()},
        )
        name = f"relay-{len(started)}"
        process = ServiceProcess(
            name, "identity-fanout", ("relay",), env, port, tmp_path / f"{name}.log"
        )
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.cleanup()


def make_relay(dsn: str, bootstrap: str, name: str, **overrides: Any) -> OutboxRelay:
    options: dict[str, Any] = {
        "client_id": name,
        "lanes": LANES,
        "poll_interval": 0.2,
        **RELAY_TEST_OPTIONS,
        **overrides,
    }
    return new_relay(dsn, bootstrap, **options)


@dataclass(frozen=True)
class LaneKit:
    """What the lane tests use: the identity database (as its owner), the broker, the
    test's access topic, relay processes (`relay_process`) and relays in this process
    (`new_relay(name, **options)`, as the relay's runtime role)."""

    identity_dsn: str
    kafka_bootstrap: str
    topic: Topic
    relay_process: Callable[..., ServiceProcess]
    new_relay: Callable[..., OutboxRelay]


@pytest.fixture
def kit(
    identity_dsn: str,
    relay_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    relay_process: Callable[..., ServiceProcess],
) -> LaneKit:
    def new_relay(name: str, **overrides: Any) -> OutboxRelay:
        return make_relay(relay_dsn, kafka_bootstrap, name, **overrides)

    topic = access_topic(kafka_topic(partitions=3))
    return LaneKit(identity_dsn, kafka_bootstrap, topic, relay_process, new_relay)


# -- tests --------------------------------------------------------------------------------


def test_a_key_has_one_slot_for_good_and_keys_spread_over_all_slots(
    db: psycopg.Connection[Any],
) -> None:
    # The database's function is the one definition of a key's slot (every writer's statement
    # calls it); pinned values: stored rows depend on them.
    [pinned] = db.execute(
        "SELECT array_agg(identity.outbox_key_slot(k) ORDER BY n)"
        " FROM unnest(ARRAY['abc', '', 'ключ']) WITH ORDINALITY AS t (k, n)"
    ).fetchall()
    assert pinned[0] == [58, 35, 29]
    counts = db.execute(
        "SELECT count(*) FROM (SELECT identity.outbox_key_slot(gen_random_uuid()::text) AS s"
        " FROM generate_series(1, 6400)) AS keys GROUP BY s"
    ).fetchall()
    # ~100 each: no slot starves, none takes a lane's share alone.
    assert len(counts) == SLOTS
    assert min(n for (n,) in counts) > 50
    with db.transaction():
        message = outbox_message(access_event(), USER_ACCESS_CHANGED)
        OUTBOX.write(db, [message])
        stored = db.execute(
            "SELECT key_slot = identity.outbox_key_slot(message_key) FROM identity.outbox"
            " WHERE message_id = %s",
            (message.message_id,),
        ).fetchone()
        assert stored == (True,)
        db.execute("DELETE FROM identity.outbox WHERE message_id = %s", (message.message_id,))


def test_lane_takeover_after_a_relay_process_is_killed(kit: LaneKit) -> None:
    killed = kit.relay_process()
    wait_until(
        lambda: len(lanes_of(kit.identity_dsn, PROCESS_APP)) == LANES, 30, "process holds all"
    )
    survivor = kit.new_relay("survivor")
    with RelayThread(survivor):
        wait_until(lambda: len(survivor.lanes) == LANES // 2, 15, "lanes shared 4 + 4")
        assert lanes_of(kit.identity_dsn, PROCESS_APP) == set(range(LANES)) - survivor.lanes
        assert status(kit.identity_dsn).instances == 2

        killed.kill()  # no goodbye: its session's locks end with its connection
        took = wait_until(lambda: len(survivor.lanes) == LANES, 10, "survivor takes every lane")
        assert took < 5
        users = [uuid.uuid4() for _ in range(40)]  # keys in (nearly) every lane
        write_versions(kit.identity_dsn, kit.topic, users, range(1, 11))
        wait_until(lambda: outbox_count(kit.identity_dsn) == 0, 30, "survivor publishes everything")
        after = status(kit.identity_dsn)
        assert after.instances == 1
        assert [h.lanes for h in after.holders] == [tuple(range(LANES))]
    seen = versions_by_user(
        kit.kafka_bootstrap, kit.topic.name, {str(u).encode(): 10 for u in users}
    )
    for versions in seen.values():
        assert_in_order_but_for_repeated_suffixes(versions, 10)


def test_two_relays_never_publish_one_lane_at_once(kit: LaneKit) -> None:
    events: list[tuple[float, str, str, int]] = []
    guard = threading.Lock()

    def probe(name: str) -> Callable[[str, int], None]:
        def record(event: str, lane_or_slot: int) -> None:
            # Slot events ("produced", "settled") are turned into their lane.
            lane = (
                lane_or_slot
                if event in {"acquired", "releasing", "lost"}
                else lane_of_slot(lane_or_slot, LANES)
            )
            with guard:
                events.append((time.monotonic(), name, event, lane))

        return record

    users = [uuid.uuid4() for _ in range(64)]
    first = kit.new_relay(
        "first",
        probe=probe("first"),
        batch_size=200,
        window_records=400,
    )
    second = kit.new_relay(
        "second",
        probe=probe("second"),
        batch_size=200,
        window_records=400,
    )
    with RelayThread(first) as a:
        wait_until(lambda: len(first.lanes) == LANES, 10, "first holds every lane")
        writer = threading.Thread(
            target=write_versions, args=(kit.identity_dsn, kit.topic, users, range(1, 101))
        )
        writer.start()
        with RelayThread(second):
            # The newcomer gets its share while rows flow; then the first leaves.
            wait_until(lambda: len(second.lanes) == LANES // 2, 15, "lanes handed over")
            a.stop.set()
            a.thread.join(30)
            wait_until(lambda: len(second.lanes) == LANES, 10, "second takes every lane")
            writer.join(120)
            wait_until(lambda: outbox_count(kit.identity_dsn) == 0, 60, "everything published")

    # Per lane: who held it when. A holder's interval runs from its "acquired" (after the
    # locks were taken) to its "releasing" (before they were given back).
    held: dict[int, list[tuple[str, float, float]]] = defaultdict(list)
    opened: dict[tuple[str, int], float] = {}
    for at, name, event, lane in events:
        if event == "acquired":
            opened[name, lane] = at
        elif event in {"releasing", "lost"}:
            held[lane].append((name, opened.pop((name, lane)), at))
    assert not opened, opened  # both stopped: every lane was given back
    handed_over = [
        lane for lane, spans in held.items() if {n for n, *_ in spans} == {"first", "second"}
    ]
    assert len(handed_over) == LANES, held  # every lane changed hands at least once
    for lane, spans in held.items():
        spans.sort(key=lambda span: span[1])
        for (_, _, end), (_, start, _) in itertools.pairwise(spans):
            assert end <= start, f"lane {lane} held twice at once: {spans}"
    published = [
        (at, name, lane) for at, name, event, lane in events if event in {"produced", "settled"}
    ]
    assert published
    for at, name, lane in published:
        assert any(n == name and s <= at <= e for n, s, e in held[lane]), (
            f"{name} published lane {lane} at {at} without holding it: {held[lane]}"
        )
    seen = versions_by_user(
        kit.kafka_bootstrap, kit.topic.name, {str(u).encode(): 100 for u in users}
    )
    for versions in seen.values():
        assert_in_order_but_for_repeated_suffixes(versions, 100)


def test_per_key_order_is_kept_across_a_takeover(kit: LaneKit) -> None:
    # 10,000 rows; a key has one record in flight at a time, so many keys keep it busy.
    users = [uuid.uuid4() for _ in range(200)]
    write_versions(kit.identity_dsn, kit.topic, users, range(1, 51))
    total = outbox_count(kit.identity_dsn)
    # Small reads and window: the process is still busy when it is killed.
    killed = kit.relay_process(relay_batch_size="100", relay_window_records="300")
    wait_until(lambda: outbox_count(kit.identity_dsn) < total, 30, "the process publishes")
    killed.kill()
    left = outbox_count(kit.identity_dsn)
    assert 0 < left < total  # killed midway

    survivor = kit.new_relay("survivor")
    with RelayThread(survivor):
        wait_until(lambda: outbox_count(kit.identity_dsn) == 0, 60, "the survivor finishes")
    seen = versions_by_user(
        kit.kafka_bootstrap, kit.topic.name, {str(u).encode(): 50 for u in users}
    )
    assert set(seen) == {str(u).encode() for u in users}
    for versions in seen.values():
        assert_in_order_but_for_repeated_suffixes(versions, 50)
