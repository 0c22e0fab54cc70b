"""Fuzzing the whole consumer path: real Kafka, real PostgreSQL, arbitrary records.

Each example sends a few records to the consumer's topic while one consumer runs: arbitrary
bytes, headers and keys, and envelopes with edge values (extreme datetimes and offsets, huge
versions, unknown enums, unknown fields, replays of earlier records). Every record must end
applied, stale, duplicate or dead-lettered, each exactly once; the consumer never crashes
and never stalls (each example's records are handled within a deadline).

A few hundred examples in `make test`; `make fuzz` runs ten thousand (PIN_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pin_contracts import (
    Headers,
    encode,
    envelope_for,
    headers_for,
    kafka_key,
)
from pin_runtime.kafka import create_consumer
from pin_testkit.events import membership_event
from pin_testkit.fuzzing import fuzz_settings, fuzz_timeout
from rewards_membership.dlq.topic import read_dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.timeout(fuzz_timeout())]

Raw = tuple[bytes | None, bytes | None, Headers]

# A small key space, so that versions of one (agent, agency) meet: stale and duplicate
# outcomes need repeats.
AGENTS = [uuid.UUID(int=n, version=4) for n in range(1, 4)]
AGENCIES = [uuid.UUID(int=100 + n, version=4) for n in range(1, 3)]

arbitrary_bytes = st.binary(max_size=512)
headers = st.lists(
    st.tuples(st.text(max_size=24), st.one_of(st.none(), st.binary(max_size=64))), max_size=4
)
offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
instants = st.datetimes(
    # Hypothesis takes naive bounds and applies `timezones` to each value it draws.
    min_value=datetime(1, 1, 2),  # noqa: DTZ001
    max_value=datetime(9999, 12, 30),  # noqa: DTZ001
    timezones=offsets,
)
versions = st.one_of(
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=-(2**70), max_value=2**70),
)
statuses = st.sampled_from(["Active", "Left", "Suspended", "", "active"])
reasons = st.one_of(st.none(), st.sampled_from(["SelfLeave", "ExcludedByAgency", "Fired"]))


@st.composite
def envelopes(draw: st.DrawFn) -> Raw:
    """A JSON envelope built from a valid one, then bent at one or more places."""
    agent, agency = draw(st.sampled_from(AGENTS)), draw(st.sampled_from(AGENCIES))
    base = envelope_for(
        # A valid event to start from; its fields are then replaced on the JSON document.
        membership_event(agent, agency, 1)
    )
    document: dict[str, Any] = msgspec.json.decode(encode(base))
    payload = document["Payload"]
    payload["Version"] = draw(versions)
    payload["Status"] = draw(statuses)
    payload["Reason"] = draw(reasons)
    payload["JoinedAt"] = draw(instants).isoformat()
    if draw(st.booleans()):
        payload["LeftAt"] = draw(instants).isoformat()
    if draw(st.booleans()):
        payload["EffectiveAt"] = draw(instants).isoformat()
    if draw(st.booleans()):
        payload[draw(st.text(min_size=1, max_size=12))] = draw(st.text(max_size=40))
    if draw(st.booleans()):
        document[draw(st.text(min_size=1, max_size=12))] = draw(st.integers())
    if draw(st.booleans()):
        document["OccurredAt"] = draw(instants).isoformat()
    value = msgspec.json.encode(document)
    return kafka_key(base), value, list(headers_for(base))


arbitrary_records = st.tuples(
    st.one_of(st.none(), arbitrary_bytes), st.one_of(st.none(), arbitrary_bytes), headers
)


def test_any_record_is_applied_stale_duplicate_or_dead_lettered_once(
    kafka: Any, start_consumer: Any, sql: Any
) -> None:
    consumer = start_consumer(poll_timeout=timedelta(milliseconds=20), batch_size=16)
    sent: list[Raw] = []

    @fuzz_settings()
    @given(
        batch=st.lists(
            st.one_of(arbitrary_records, envelopes(), envelopes()), min_size=1, max_size=4
        ),
        replay=st.booleans(),
    )
    def example(batch: list[Raw], replay: bool) -> None:
        if replay and sent:  # a redelivery of an earlier record: a duplicate
            batch = [*batch, sent[len(sent) // 2]]
        kafka.send_raw(*batch)
        sent.extend(batch)
        consumer.wait_handled(len(sent), timeout=30)  # never stalls, never crashes

    example()
    consumer.close()
    assert consumer.handled == len(sent)  # each record had exactly one outcome
    reader = create_consumer(kafka.bootstrap, group_id="dlq-reader", client_id="fuzz")
    try:
        dead = list(read_dead_letters(reader, kafka.dlq_topic, timeout=30))
    finally:
        reader.close()
    assert len(dead) == consumer.total("rewards_identity_membership_dlq_total")
    assert all(r.info is not None and r.info.exception_message for r in dead)
    places = {(r.info.original_partition, r.info.original_offset) for r in dead if r.info}
    assert len(places) == len(dead)  # no record dead-lettered twice
    # The examples reached every outcome, not only the DLQ.
    for counter in (
        "rewards_membership_applied_total",
        "rewards_membership_skipped_stale_total",
        "rewards_membership_skipped_duplicate_total",
        "rewards_identity_membership_dlq_total",
    ):
        assert consumer.total(counter) > 0, counter
    (inbox,) = sql("SELECT count(*) FROM rewards.inbox")[0]
    applied_or_stale = consumer.total("rewards_membership_applied_total") + consumer.total(
        "rewards_membership_skipped_stale_total"
    )
    assert inbox >= applied_or_stale > 0
