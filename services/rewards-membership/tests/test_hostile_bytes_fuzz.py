"""No bytes stop the consumer or its DLQ tools: every pure path that reads a record's bytes,
fuzzed with hostile records (`pin_testkit.hostile_bytes`).

Records nested up to 100,000 deep, as large as the topic admits, with invalid UTF-8,
duplicate keys and numbers beyond int64 and float, arbitrary keys and headers: each is
validated (a change or the reason it is refused, never an exception), its log fields
read, its dead letter built and read back as `dlq list` and `dlq replay` read it.
No services: a few hundred examples in `make test` take seconds; `make fuzz` runs ten
thousand (PIN_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import contextlib
import logging

import msgspec
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message
from hypothesis import given
from hypothesis import strategies as st

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    IDENTITY_MEMBERSHIP_DLQ,
    ContractViolation,
    DeadLetterInfo,
    Headers,
    Unreadable,
    encode,
    envelope_for,
    kafka_key,
)
from pin_runtime.logging import FIELDS_ATTRIBUTE, JsonFormatter
from pin_testkit.events import membership_event
from pin_testkit.fuzzing import fuzz_settings
from pin_testkit.hostile_bytes import extended, header_lists, keys, values
from rewards_membership.dlq.reference import DeadLetterReference, decode_reference
from rewards_membership.dlq.topic import dead_letter_info, dead_letter_record
from rewards_membership.ops.dlq import dead_letter_row
from rewards_membership.records import event_fields, headers_of, key_text
from rewards_membership.rules.validation import (
    KEY_PROBLEMS,
    InvalidEvent,
    MembershipChange,
    validate,
)

MAX_BYTES = AGENT_MEMBERSHIP_CHANGED.max_message_bytes
_SCALARS = (str, int, float, bool, type(None))
FORMATTER = JsonFormatter(service="rewards-membership")


def message(topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> Message:
    return Message(
        topic=topic,
        partition=1,
        offset=7,
        key=key,
        value=value,
        headers=headers or None,
        timestamp=(TIMESTAMP_CREATE_TIME, 1_700_000_000_000),
        error=None,
    )


@fuzz_settings()
@given(value=values(MAX_BYTES), key=keys, headers=header_lists)
def test_any_record_is_a_change_or_a_dead_letter_the_tools_read_back(
    value: bytes | None, key: bytes | None, headers: Headers
) -> None:
    record = message(AGENT_MEMBERSHIP_CHANGED.name, key, value, headers)
    item = validate(record.value(), record.key())
    assert isinstance(item, MembershipChange | InvalidEvent)
    fields = event_fields(item, record, None)
    trace_id = fields["trace_id"]
    assert trace_id is None or (len(trace_id) == 32 and int(trace_id, 16) > 0)
    if isinstance(item, MembershipChange):
        assert item.key_problem in (None, *KEY_PROBLEMS)
        assert (item.key_problem is None) == (key == str(item.payload.agent_user_id).encode())
        return
    assert item.reason
    for name, found in item.fields.items():
        assert isinstance(found, _SCALARS), name
        assert not isinstance(found, str) or len(found) <= 100
    # Its `dead-lettered` line can be written (as JSON, by the services' formatter).
    line = logging.LogRecord("rewards_membership", logging.ERROR, __file__, 0, "x", None, None)
    setattr(line, FIELDS_ATTRIBUTE, {**fields, "reason": item.message, "key": key_text(record)})
    msgspec.json.decode(FORMATTER.format(line))

    # Its dead letter: the record's own headers and the DLQ's, read back by the tools.
    info = dead_letter_info(record, item, "rewards-membership")
    dlq_headers = headers_of(record) + info.to_headers()
    dead = dead_letter_record(message(IDENTITY_MEMBERSHIP_DLQ.name, key, value, dlq_headers))
    assert dead.info == info
    row = dead_letter_row(dead, "pending")
    assert row.reason == item.message
    msgspec.json.encode(row)  # `dlq list --json`
    assert isinstance(validate(dead.value), InvalidEvent)  # what `dlq replay` checks first


@st.composite
def events(draw: st.DrawFn) -> tuple[bytes, bytes | None]:
    """A valid event, as is or with members appended (duplicate keys among them), and its
    right key or any other."""
    payload = membership_event(draw(st.uuids()), draw(st.uuids()), draw(st.integers(1, 2**40)))
    envelope = envelope_for(payload)
    value = draw(st.one_of(st.just(encode(envelope)), extended(encode(envelope), MAX_BYTES)))
    return value, draw(st.one_of(st.just(kafka_key(envelope)), keys))


@fuzz_settings()
@given(event=events(), headers=header_lists)
def test_any_key_of_a_valid_or_bent_event_is_named_never_raised(
    event: tuple[bytes, bytes | None], headers: Headers
) -> None:
    value, key = event
    record = message(AGENT_MEMBERSHIP_CHANGED.name, key, value, headers)
    item = validate(record.value(), record.key())
    if isinstance(item, MembershipChange):
        assert item.key_problem in (None, *KEY_PROBLEMS)
        assert (item.key_problem is None) == (key == str(item.payload.agent_user_id).encode())
    else:
        assert item.reason
    event_fields(item, record, None)


@fuzz_settings()
@given(
    value=st.one_of(values(MAX_BYTES), st.binary(max_size=256)),
    key=keys,
    headers=header_lists,
)
def test_any_dead_letter_is_listed_whatever_its_headers_and_value(
    value: bytes | None, key: bytes | None, headers: Headers
) -> None:
    # A record on the DLQ written by anything: its headers may be anyone's.
    with contextlib.suppress(ContractViolation):  # the only error it may raise
        DeadLetterInfo.from_headers(headers)
    dead = dead_letter_record(message(IDENTITY_MEMBERSHIP_DLQ.name, key, value, headers))
    assert (dead.info is None) == (dead.problem is not None)
    msgspec.json.encode(dead_letter_row(dead, "pending"))
    reference = decode_reference(value)  # what `dlq replay` reads of a reference record
    assert isinstance(reference, DeadLetterReference | Unreadable)
