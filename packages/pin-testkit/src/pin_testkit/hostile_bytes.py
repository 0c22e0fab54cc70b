"""Hypothesis strategies of bytes a hostile or broken producer can put in a record: JSON-ish
documents nested up to 100,000 deep, as large as a topic admits, with invalid UTF-8,
duplicate keys and numbers beyond int64 and float; and arbitrary headers and keys.

Built from a few small draws (a depth, a pattern, a size), never from drawing every byte:
an example of a megabyte costs Hypothesis as little as one of ten bytes, so the pure
targets that use these run hundreds of examples in seconds.
"""

from __future__ import annotations

import uuid
from typing import Final

import msgspec
from hypothesis import strategies as st

from pin_contracts import MESSAGE_ID_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER
from pin_contracts.dlq import DLQ_HEADERS

__all__ = [
    "ENVELOPE_NAMES",
    "MAX_DEPTH",
    "PAYLOAD_NAMES",
    "documents",
    "extended",
    "header_lists",
    "keys",
    "nested",
    "scalars",
    "values",
]

MAX_DEPTH: Final = 100_000
ENVELOPE_NAMES: Final = (
    "MessageId",
    "EventType",
    "ContractVersion",
    "AggregateType",
    "Version",
    "OccurredAt",
    "CorrelationId",
    "Payload",
)
PAYLOAD_NAMES: Final = (
    "AgentUserId",
    "CompanyId",
    "UserId",
    "MembershipId",
    "Status",
    "Reason",
    "Version",
    "JoinedAt",
    "LeftAt",
    "EffectiveAt",
)
_UUIDS: Final = [uuid.UUID(int=n, version=4) for n in (1, 2)]

_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: str(n).encode()),
    # Beyond uint64 and beyond any double: hundreds to thousands of digits.
    st.integers(min_value=20, max_value=5000).map(lambda n: b"9" * n),
    st.sampled_from(
        [b"1e400", b"-1e400", b"1e-400", b"1.7976931348623157e309", b"-0", b"0.1e99999", b"1E+2"]
    ),
)
_strings = st.one_of(
    st.text(max_size=40).map(msgspec.json.encode),
    st.sampled_from([str(u) for u in _UUIDS] + [str(_UUIDS[0]).upper()]).map(msgspec.json.encode),
    # Raw bytes between quotes: invalid UTF-8 and control characters.
    st.binary(max_size=24).map(lambda b: b'"' + b.replace(b'"', b"").replace(b"\\", b"") + b'"'),
    st.sampled_from([b'"\\udcff"', b'"\\ud800"', b'"\\ud800\\udc00"', b'"\\u0000"', b'"\\x"']),
)
scalars = st.one_of(st.sampled_from([b"null", b"true", b"false"]), _numbers, _strings)
"""One JSON scalar as bytes, hostile or not."""

_OPENERS: Final = {b"[": b"]", b'{"a":': b"}", b'{"a":1,"a":': b"}", b'{"Payload":': b"}"}


@st.composite
def nested(draw: st.DrawFn, inner: st.SearchStrategy[bytes] = scalars) -> bytes:
    """`inner` inside up to `MAX_DEPTH` arrays and objects (a repeated pattern of them),
    closed or, sometimes, left open."""
    depth = draw(st.one_of(st.integers(0, 8), st.integers(900, 1100), st.integers(0, MAX_DEPTH)))
    pattern = draw(st.lists(st.sampled_from(list(_OPENERS)), min_size=1, max_size=3))
    times = max(1, depth // len(pattern))
    opening = b"".join(pattern) * times
    closing = b"".join(_OPENERS[o] for o in reversed(pattern)) * times
    if draw(st.integers(0, 9)) == 0:
        closing = closing[: draw(st.integers(0, len(closing)))]
    return opening + draw(inner) + closing


def _member(names: tuple[str, ...], value: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    name = st.one_of(st.sampled_from(names), st.text(max_size=8))
    return st.builds(lambda n, v: msgspec.json.encode(n) + b":" + v, name, value)


_payloads = st.lists(
    _member(PAYLOAD_NAMES, st.one_of(scalars, nested())), max_size=len(PAYLOAD_NAMES) + 3
).map(lambda members: b"{" + b",".join(members) + b"}")


@st.composite
def documents(draw: st.DrawFn, max_size: int) -> bytes:
    """An envelope-like JSON object: the envelope's and the payload's names (each possibly
    more than once: duplicate keys), hostile values, and sometimes a filler up to `max_size`
    bytes in all."""
    value = st.one_of(scalars, nested(), _payloads, nested(_payloads))
    members = draw(st.lists(_member(ENVELOPE_NAMES, value), max_size=len(ENVELOPE_NAMES) + 3))
    document = b"{" + b",".join(members) + b"}"
    if draw(st.booleans()):
        size = draw(st.one_of(st.integers(0, 4096), st.integers(0, max_size), st.just(max_size)))
        filler = size - len(document) - len(b',"Filler":""')
        if filler > 0:
            body = draw(st.sampled_from([b"x", b"\xff", b"\xc3\xa9"])) * (filler // 2 * 2)
            document = document[:-1] + (b"," if members else b"") + b'"Filler":"' + body + b'"}'
    return document[:max_size]


@st.composite
def extended(draw: st.DrawFn, document: bytes, max_size: int) -> bytes:
    """`document` (a JSON object, a valid event say) with members appended: the envelope's
    names again (duplicate keys: the last counts) or others, holding hostile values, so
    many examples stay valid or nearly."""
    value = st.one_of(scalars, nested(), _payloads)
    members = draw(st.lists(_member(ENVELOPE_NAMES, value), min_size=1, max_size=3))
    bent = document[:-1] + b"," + b",".join(members) + b"}"
    return bent if len(bent) <= max_size else document


def values(max_size: int) -> st.SearchStrategy[bytes | None]:
    """A record value: a hostile document (nested or not), arbitrary bytes, or null."""
    return st.one_of(
        documents(max_size),
        nested(documents(max_size)).map(lambda v: v[:max_size]),
        nested(),
        st.binary(max_size=64),
        st.none(),
    )


keys = st.one_of(
    st.none(),
    st.just(b""),
    st.binary(max_size=48),
    st.sampled_from([str(u).encode() for u in _UUIDS] + [str(_UUIDS[0]).upper().encode()]),
)
"""A record key: null, empty, arbitrary bytes (invalid UTF-8), a UUID's text in any case."""

_HEADER_NAMES: Final = sorted(
    {*DLQ_HEADERS, TRACEPARENT_HEADER, TRACESTATE_HEADER, MESSAGE_ID_HEADER}
)
_header_values = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"\xff" * 8,
            b"\xff" * 4,
            b"00-" + b"\xff" * 32 + b"-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-ZZZZ2f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ]
    ),
    st.integers(0, 100_000).map(lambda n: b"9" * n),
)
header_lists = st.lists(
    st.tuples(st.one_of(st.sampled_from(_HEADER_NAMES), st.text(max_size=24)), _header_values),
    max_size=8,
)
"""Arbitrary headers, the names the services read among them."""
