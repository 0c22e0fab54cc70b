"""`outbox.partitions`: which partition a record goes to, and when a topic makes it wait."""

from __future__ import annotations

from confluent_kafka import KafkaError

from identity_fanout.outbox.partitions import (
    CHECK_INTERVAL,
    RECHECK_INTERVAL,
    Change,
    TopicPartitions,
    catalogue_partitions,
)
from identity_fanout.settings import LagWatchSettings
from pin_contracts import AGENT_MEMBERSHIP_CHANGED, USER_ACCESS_CHANGED, key_partition
from pin_runtime.delivery import classify

ACCESS = USER_ACCESS_CHANGED.name
KEY = b"0b6f7a4e-2f1c-4d8e-9a51-3c2d1e0f9a8b"


def test_the_catalogue_of_the_relay_is_its_event_topics() -> None:
    assert catalogue_partitions() == {ACCESS: 3, AGENT_MEMBERSHIP_CHANGED.name: 3}


def test_records_are_pinned_by_the_catalogues_count_whatever_the_cluster_has() -> None:
    pins = TopicPartitions.of({ACCESS: 3})
    assert pins.observe({ACCESS: 6}, 0.0, looked={ACCESS}) == [Change(ACCESS, 6, 3)]
    assert pins.usable(ACCESS)  # more partitions: published on
    assert pins.partition(ACCESS, KEY) == key_partition(KEY, 3)
    assert pins.partition(ACCESS, KEY) == USER_ACCESS_CHANGED.partition_of(KEY)


def test_fewer_partitions_or_no_topic_refuse_as_the_cluster_would() -> None:
    pins = TopicPartitions.of({ACCESS: 3})
    pins.observe({ACCESS: 2}, 0.0, looked={ACCESS})
    assert not pins.usable(ACCESS)
    failure = classify(pins.refusal(ACCESS))
    assert (failure.reason, failure.cluster_wide, failure.retriable) == (
        "partition-count",
        True,
        True,
    )
    assert pins.observe({ACCESS: None}, 1.0, looked={ACCESS}) == [Change(ACCESS, None, 3)]
    assert classify(pins.refusal(ACCESS)).reason == "unknown-topic"
    assert pins.observe({ACCESS: 3}, 2.0, looked={ACCESS}) == [Change(ACCESS, 3, 3)]
    assert pins.usable(ACCESS)


def test_a_first_look_that_matches_is_no_change_and_a_failed_look_blocks_nothing() -> None:
    pins = TopicPartitions.of({ACCESS: 3})
    assert pins.usable(ACCESS)  # not seen yet: the cluster answers for itself
    assert pins.observe({ACCESS: 3}, 0.0, looked={ACCESS}) == []


def test_looks_are_periodic_and_a_waiting_or_new_topic_is_looked_at_sooner() -> None:
    pins = TopicPartitions.of({ACCESS: 3})
    assert pins.due({"other"}, 0.0) == {ACCESS, "other"}  # the first round: all
    pins.observe({ACCESS: 2, "other": 4}, 0.0, looked={ACCESS, "other"})
    assert pins.partition("other", KEY) == key_partition(KEY, 4)  # outside: as first seen
    assert pins.due({"other"}, 0.5) == set()
    assert pins.due({"other", "new"}, 0.5) == {"new"}  # first sight at once
    assert pins.due({ACCESS, "other"}, RECHECK_INTERVAL) == {ACCESS}  # waiting: every try
    assert pins.due({"other"}, CHECK_INTERVAL) == {ACCESS, "other"}


def test_an_unknown_partition_from_the_client_is_the_same_refusal() -> None:
    assert classify(KafkaError(KafkaError._UNKNOWN_PARTITION)).reason == "partition-count"


def test_the_lag_watcher_exports_the_access_topics_catalogue_count() -> None:
    watch = LagWatchSettings(kafka_bootstrap="k:9092")
    assert watch.catalogue_partitions() == {ACCESS: 3}
