"""Record key, headers and the DLQ header format."""

from __future__ import annotations

import struct

import pytest

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    CONTRACT_VERSION_HEADER,
    DLQ_HEADERS,
    DLT_ORIGINAL_OFFSET_HEADER,
    DLT_ORIGINAL_PARTITION_HEADER,
    DLT_ORIGINAL_TIMESTAMP_HEADER,
    DLT_VALUE_REPLACED_HEADER,
    ERROR_CODE_HEADER,
    ERROR_PATH_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    REWARDS_MEMBERSHIP_CONSUMER_GROUP,
    REWARDS_MEMBERSHIP_EVENT_INVALID,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
    AgentMembershipChanged,
    ContractViolation,
    DeadLetterInfo,
    Envelope,
    InvalidEventError,
    UserAccessChangedKafkaEvent,
    header_text,
    headers_for,
    kafka_key,
    original_headers,
    trace_context,
    trace_headers,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_key_is_the_canonical_uuid_of_the_key_field(
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    assert kafka_key(access_envelope) == b"0f0e0d0c-0b0a-4908-8706-050403020100"
    assert kafka_key(access_envelope.payload) == kafka_key(access_envelope)
    assert kafka_key(membership_envelope) == b"a1b2c3d4-e5f6-4789-8abc-def012345678"


def test_headers_carry_routing_and_trace(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    headers = headers_for(
        membership_envelope,
        trace_context={TRACEPARENT_HEADER: TRACEPARENT, TRACESTATE_HEADER: "pin=1", "baggage": "x"},
    )

    assert headers == [
        (EVENT_TYPE_HEADER, b"AgentMembershipChanged"),
        (CONTRACT_VERSION_HEADER, b"1"),
        (MESSAGE_ID_HEADER, str(membership_envelope.message_id).encode()),
        (TRACEPARENT_HEADER, TRACEPARENT.encode()),
        (TRACESTATE_HEADER, b"pin=1"),
    ]


def test_no_trace_headers_without_a_traceparent(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    without = headers_for(membership_envelope)
    orphan_state = headers_for(membership_envelope, trace_context={TRACESTATE_HEADER: "pin=1"})

    assert [name for name, _ in without] == [
        EVENT_TYPE_HEADER,
        CONTRACT_VERSION_HEADER,
        MESSAGE_ID_HEADER,
    ]
    assert orphan_state == without


def test_trace_headers_are_what_headers_for_appends(
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    for carrier in (
        None,
        {},
        {TRACESTATE_HEADER: "pin=1"},
        {TRACEPARENT_HEADER: TRACEPARENT},
        {TRACEPARENT_HEADER: TRACEPARENT, TRACESTATE_HEADER: "pin=1", "baggage": "x"},
    ):
        assert headers_for(membership_envelope, trace_context=carrier)[3:] == trace_headers(carrier)
    assert trace_headers({TRACEPARENT_HEADER: TRACEPARENT, TRACESTATE_HEADER: "pin=1"}) == [
        (TRACEPARENT_HEADER, TRACEPARENT.encode()),
        (TRACESTATE_HEADER, b"pin=1"),
    ]


def test_received_headers_are_read_tolerantly() -> None:
    received: list[tuple[str, bytes | None]] = [
        (TRACEPARENT_HEADER, b"stale"),
        (TRACEPARENT_HEADER, TRACEPARENT.encode()),
        (TRACESTATE_HEADER, b"\xff"),
        (MESSAGE_ID_HEADER, None),
    ]

    assert header_text(received, TRACEPARENT_HEADER) == TRACEPARENT
    assert header_text(received, TRACESTATE_HEADER) is None
    assert header_text(received, MESSAGE_ID_HEADER) is None
    assert header_text(None, TRACEPARENT_HEADER) is None
    assert trace_context(received) == {TRACEPARENT_HEADER: TRACEPARENT}
    assert trace_context(None) == {}


def dead_letter(**overrides: object) -> DeadLetterInfo:
    fields: dict[str, object] = {
        "error_code": REWARDS_MEMBERSHIP_EVENT_INVALID,
        "exception_message": "$.Payload.CompanyId: Guid.Empty",
        "exception_fqcn": "pin_contracts.errors.ContractViolation",
        "original_topic": AGENT_MEMBERSHIP_CHANGED.name,
        "original_partition": 2,
        "original_offset": 1_234_567_890_123,
        "original_timestamp_ms": 1_740_830_400_000,
        "original_consumer_group": REWARDS_MEMBERSHIP_CONSUMER_GROUP,
        "error_path": "$.Payload.CompanyId",
    }
    fields.update(overrides)
    return DeadLetterInfo(**fields)  # type: ignore[arg-type]


def test_dead_letter_headers_round_trip_after_the_original_headers() -> None:
    info = dead_letter()
    original = [(TRACEPARENT_HEADER, TRACEPARENT.encode())]

    parsed = DeadLetterInfo.from_headers([*original, *info.to_headers()])

    assert parsed == info
    assert parsed.original_timestamp_type == "CreateTime"


def test_original_headers_strip_every_dead_letter_header_and_keep_the_rest_in_order() -> None:
    original = [
        (TRACEPARENT_HEADER, TRACEPARENT.encode()),
        (MESSAGE_ID_HEADER, b"m-1"),
        (EVENT_TYPE_HEADER, b"AgentMembershipChanged"),
    ]
    dead_letter_headers = [*dead_letter().to_headers(), (DLT_VALUE_REPLACED_HEADER, b"too-large")]

    assert {name for name, _ in dead_letter_headers} == DLQ_HEADERS
    assert original_headers([*original, *dead_letter_headers]) == original


def test_dead_letter_numbers_use_springs_big_endian_encoding() -> None:
    headers = dict(dead_letter().to_headers())

    assert headers[DLT_ORIGINAL_PARTITION_HEADER] == struct.pack(">i", 2)
    assert headers[DLT_ORIGINAL_OFFSET_HEADER] == (1_234_567_890_123).to_bytes(8, "big")
    assert headers[DLT_ORIGINAL_TIMESTAMP_HEADER] == struct.pack(">q", 1_740_830_400_000)
    assert headers[ERROR_CODE_HEADER] == b"REWARDS_MEMBERSHIP_EVENT_INVALID"


def test_the_latest_dead_letter_headers_win() -> None:
    first = dead_letter(original_offset=1)
    second = dead_letter(original_offset=2, error_path=None)

    parsed = DeadLetterInfo.from_headers([*first.to_headers(), *second.to_headers()])

    assert parsed.original_offset == 2
    # error_path is optional: the older set's value still shows through.
    assert parsed.error_path == "$.Payload.CompanyId"


def test_error_path_is_optional() -> None:
    headers = [(n, v) for n, v in dead_letter().to_headers() if n != ERROR_PATH_HEADER]

    assert DeadLetterInfo.from_headers(headers).error_path is None


@pytest.mark.parametrize(
    ("drop", "replace", "path"),
    [
        (ERROR_CODE_HEADER, None, f"headers.{ERROR_CODE_HEADER}"),
        (
            None,
            (DLT_ORIGINAL_PARTITION_HEADER, b"\x00\x01"),
            f"headers.{DLT_ORIGINAL_PARTITION_HEADER}",
        ),
        (None, (ERROR_CODE_HEADER, b"\xff"), f"headers.{ERROR_CODE_HEADER}"),
    ],
)
def test_malformed_dead_letter_headers_are_violations(
    drop: str | None, replace: tuple[str, bytes] | None, path: str
) -> None:
    headers = [(n, v) for n, v in dead_letter().to_headers() if n != drop]
    if replace is not None:
        headers.append(replace)

    with pytest.raises(ContractViolation) as caught:
        DeadLetterInfo.from_headers(headers)

    assert caught.value.path == path


def test_out_of_range_dead_letter_numbers_are_refused() -> None:
    with pytest.raises(InvalidEventError):
        dead_letter(original_partition=2**31)
    with pytest.raises(InvalidEventError):
        dead_letter(original_offset=2**63)
