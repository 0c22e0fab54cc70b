"""The lag watcher against a real broker: backlogs in records and seconds, catching up,
groups whose consumers are gone, discovery, and a broker outage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.cimpl import NewPartitions
from prometheus_client import CollectorRegistry

from pin_runtime.http import ComponentState
from pin_runtime.kafka import create_admin, create_consumer
from pin_runtime.lag_watch.brokers import Brokers
from pin_runtime.lag_watch.metrics import LagWatchMetrics
from pin_runtime.lag_watch.watcher import LagWatcher, WatchPlan
from pin_testkit.private import PrivateKafka
from pin_testkit.records import commit_group_offsets
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

READER_GROUP = "pin-runtime-test-lag-watcher"
AGE = 600.0  # the records' timestamps lie this far in the past


@dataclass
class Watch:
    """A watcher on a real broker, its registry, readiness and (settable) wall clock."""

    watcher: LagWatcher
    registry: CollectorRegistry
    state: ComponentState
    reader: Consumer
    now: list[float]

    def lag(self, group: str, topic: str, partition: int) -> float | None:
        labels = {"consumergroup": group, "topic": topic, "partition": str(partition)}
        return self.registry.get_sample_value("kafka_consumergroup_lag", labels)

    def seconds(self, group: str, topic: str, partition: int) -> float | None:
        labels = {"consumergroup": group, "topic": topic, "partition": str(partition)}
        return self.registry.get_sample_value("kafka_consumergroup_lag_seconds", labels)

    def errors(self, kind: str) -> float:
        value = self.registry.get_sample_value("pin_lag_watcher_errors_total", {"kind": kind})
        return value or 0.0

    def last_success(self, topic: str) -> float | None:
        return self.registry.get_sample_value(
            "pin_lag_watcher_last_success_timestamp_seconds", {"topic": topic}
        )

    def groups(self) -> set[str]:
        return {
            sample.labels["consumergroup"]
            for family in self.registry.collect()
            if family.name == "kafka_consumergroup_lag"
            for sample in family.samples
        }


WatchFactory = Callable[..., Watch]


@pytest.fixture
def watch(kafka_bootstrap: str) -> Iterator[WatchFactory]:
    readers: list[Consumer] = []
    closers: list[Callable[[], None]] = []

    def make(
        topics: tuple[str, ...],
        *,
        groups: tuple[str, ...] = (),
        discover: bool = False,
        exclude: frozenset[str] = frozenset(),
        bootstrap: str = kafka_bootstrap,
        timeout: float = 10.0,
        partitions: dict[str, int] | None = None,
    ) -> Watch:
        registry = CollectorRegistry()
        state = ComponentState()
        reader = create_consumer(
            bootstrap,
            group_id=READER_GROUP,
            client_id="pin-runtime-test-lag-reader",
            extra={"log_level": 0},
        )
        readers.append(reader)
        now = [time.time()]
        brokers = Brokers(
            admin=create_admin(bootstrap, client_id="pin-runtime-test-lag-admin"),
            reader=reader,
            offsets_reader=lambda group: create_consumer(
                bootstrap,
                group_id=group,
                client_id="pin-runtime-test-lag-offsets",
                extra={"log_level": 0},
            ),
            timeout=timeout,
        )
        closers.append(brokers.close)
        plan = WatchPlan(
            topics=topics,
            groups=groups,
            discover=discover,
            exclude=exclude | {READER_GROUP},
            max_groups=50,
            interval=1.0,
            stale_after=600.0,
            partitions=partitions or {},
        )
        watcher = LagWatcher(
            plan=plan,
            brokers=brokers,
            metrics=LagWatchMetrics(registry),
            state=state,
            wall=lambda: now[0],
        )
        return Watch(watcher, registry, state, reader, now)

    yield make
    for close in closers:
        close()
    for reader in readers:
        reader.close()


def produce_old(bootstrap: str, topic: str, partition: int, count: int, *, age: float) -> float:
    """`count` records on `partition`, stamped `age` seconds ago, one second apart; the
    timestamp of the first (what a group that has consumed none of them waits on)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    first = time.time() - age
    for index in range(count):
        producer.produce(
            topic,
            value=b"x",
            partition=partition,
            timestamp=int((first + index) * 1000),
        )
    assert producer.flush(30) == 0
    return first


def new_group() -> str:
    return f"pin-runtime-test-group-{uuid.uuid4().hex[:8]}"


def test_a_backlog_shows_in_records_and_seconds_and_is_gone_once_caught_up(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], watch: WatchFactory
) -> None:
    topic = kafka_topic(partitions=3)
    first = produce_old(kafka_bootstrap, topic, 0, 10, age=AGE)
    group = new_group()
    commit_group_offsets(kafka_bootstrap, group, topic, {0: 4, 1: 0, 2: 0})
    w = watch((topic,), groups=(group,))

    report = w.watcher.run_pass()

    assert report.errors == []
    assert w.lag(group, topic, 0) == 6
    # The oldest unconsumed record is the one at the committed offset (4): stamped first + 4.
    assert w.seconds(group, topic, 0) == pytest.approx(w.now[0] - (first + 4), abs=0.01)
    assert (w.lag(group, topic, 1), w.seconds(group, topic, 1)) == (0, 0)
    assert w.last_success(topic) == w.now[0]
    assert w.state().status == "ok"

    # No consumer and no new record: the next pass shows the same backlog, a little older.
    w.now[0] += 15
    w.watcher.run_pass()
    assert w.lag(group, topic, 0) == 6
    assert w.seconds(group, topic, 0) == pytest.approx(w.now[0] - (first + 4), abs=0.01)

    # The group commits the end: caught up at the next pass, without any new record.
    commit_group_offsets(kafka_bootstrap, group, topic, {0: 10})
    w.now[0] += 15
    w.watcher.run_pass()
    assert (w.lag(group, topic, 0), w.seconds(group, topic, 0)) == (0, 0)


def test_a_topic_grown_past_the_catalogues_count_shows_beside_it(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], watch: WatchFactory
) -> None:
    topic = kafka_topic(partitions=3)
    w = watch((topic,), groups=(new_group(),), partitions={topic: 3})

    def counts() -> tuple[float | None, float | None]:
        return (
            w.registry.get_sample_value("pin_lag_watcher_topic_partitions", {"topic": topic}),
            w.registry.get_sample_value(
                "pin_lag_watcher_topic_partitions_expected", {"topic": topic}
            ),
        )

    assert counts() == (None, 3)  # the catalogue's from the start, the cluster's once read
    w.watcher.run_pass()
    assert counts() == (3, 3)
    admin = create_admin(kafka_bootstrap, client_id="pin-runtime-test-lag-admin")
    for future in admin.create_partitions([NewPartitions(topic, 6)]).values():
        future.result(30)

    def grown() -> bool:
        w.watcher.run_pass()
        return counts() == (6, 3)

    wait_until(grown, 30, "6 partitions seen beside the catalogue's 3")


def test_a_listed_group_that_never_committed_counts_from_the_first_record(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], watch: WatchFactory
) -> None:
    topic = kafka_topic(partitions=3)
    first = produce_old(kafka_bootstrap, topic, 2, 3, age=AGE)
    group = new_group()  # never seen by the broker
    w = watch((topic,), groups=(group,))

    w.watcher.run_pass()

    assert [w.lag(group, topic, p) for p in range(3)] == [0, 0, 3]
    assert w.seconds(group, topic, 2) == pytest.approx(w.now[0] - first, abs=0.01)


def test_a_group_whose_consumers_are_gone_still_shows_its_lag(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], watch: WatchFactory
) -> None:
    topic = kafka_topic(partitions=1)
    produce_old(kafka_bootstrap, topic, 0, 5, age=AGE)
    group = new_group()
    # A real member of the group consumes and commits two records, then leaves for good.
    consumer = create_consumer(
        kafka_bootstrap,
        group_id=group,
        client_id="pin-runtime-test-member",
        extra={"log_level": 0},
    )
    consumer.subscribe([topic])
    taken: list[Message] = []

    def consumed_two() -> bool:
        for message in consumer.consume(num_messages=2 - len(taken), timeout=0.5):
            assert message.error() is None
            taken.append(message)
        return len(taken) == 2

    wait_until(consumed_two, 60, "the member consumed two records")
    consumer.commit(message=taken[-1], asynchronous=False)
    consumer.close()
    later = produce_old(kafka_bootstrap, topic, 0, 3, age=60.0)
    w = watch((topic,), groups=(group,))

    w.watcher.run_pass()

    assert w.lag(group, topic, 0) == 6  # 3 old ones left and 3 new ones
    seconds = w.seconds(group, topic, 0)
    assert seconds is not None
    assert seconds > w.now[0] - later  # the age of the old record, not of the new ones


def test_discovery_finds_the_groups_with_offsets_on_the_topic(
    kafka_bootstrap: str, kafka_topic: Callable[..., str], watch: WatchFactory
) -> None:
    topic, elsewhere = kafka_topic(partitions=3), kafka_topic(partitions=1)
    produce_old(kafka_bootstrap, topic, 1, 4, age=AGE)
    crm, gateway, retired, other = new_group(), new_group(), new_group(), new_group()
    commit_group_offsets(kafka_bootstrap, crm, topic, {1: 4})
    commit_group_offsets(kafka_bootstrap, gateway, topic, {1: 1})
    commit_group_offsets(kafka_bootstrap, retired, topic, {1: 0})
    commit_group_offsets(kafka_bootstrap, other, elsewhere, {0: 0})
    w = watch((topic,), discover=True, exclude=frozenset({retired}))

    report = w.watcher.run_pass()

    assert report.errors == []
    assert w.groups() == {crm, gateway}
    assert report.watched == {topic: sorted([crm, gateway])}
    assert (w.lag(crm, topic, 1), w.lag(gateway, topic, 1)) == (0, 3)
    assert w.lag(gateway, topic, 0) == 0  # a partition it never committed, empty
    assert w.registry.get_sample_value("pin_lag_watcher_groups", {"topic": topic}) == 2


def test_a_broker_outage_counts_errors_keeps_the_series_and_recovers(
    private_kafka: PrivateKafka, watch: WatchFactory
) -> None:
    topic = private_kafka.create_topic(partitions=1)
    first = produce_old(private_kafka.bootstrap, topic, 0, 3, age=AGE)
    group = new_group()
    commit_group_offsets(private_kafka.bootstrap, group, topic, {0: 1})
    w = watch((topic,), groups=(group,), bootstrap=private_kafka.bootstrap, timeout=2.0)
    w.watcher.run_pass()
    assert w.lag(group, topic, 0) == 2
    succeeded = w.last_success(topic)

    private_kafka.stop()
    w.now[0] += 30
    report = w.watcher.run_pass()

    assert report.errors
    assert w.errors("metadata") == 1
    assert w.state().status == "degraded"
    assert w.last_success(topic) == succeeded
    # The group was behind and nothing says otherwise: its series stay, its age grows.
    assert w.lag(group, topic, 0) == 2
    assert w.seconds(group, topic, 0) == pytest.approx(w.now[0] - (first + 1), abs=0.01)

    private_kafka.start()
    commit_group_offsets(private_kafka.bootstrap, group, topic, {0: 3})

    def recovered() -> bool:
        w.now[0] += 1
        return not w.watcher.run_pass().errors

    wait_until(recovered, 60, "a pass without errors after the restart", interval=0.5)
    assert w.state().status == "ok"
    assert (w.lag(group, topic, 0), w.seconds(group, topic, 0)) == (0, 0)
    assert w.last_success(topic) == w.now[0]
