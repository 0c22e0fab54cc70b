"""Outbox rows as the Kafka records the relay produces, byte for byte."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from itertools import chain
from operator import attrgetter, itemgetter, methodcaller
from typing import Any, Final, NamedTuple, cast

import msgspec
from opentelemetry import trace
from opentelemetry.trace import Link
from psycopg.rows import TupleRow

from pin_contracts import Unreadable, read_untrusted
from pin_runtime.logging import log_event
from pin_runtime.tracing import Headers, extract_context

__all__ = ["MAX_SPAN_LINKS", "OutboxRecord", "record_from_row", "records_from_rows", "span_links"]

_log = logging.getLogger(__name__)

MAX_SPAN_LINKS: Final = 32
"""Links from a round's span to the traces that wrote its rows (distinct contexts, first N)."""


class OutboxRecord(NamedTuple):
    """One row of `read_lanes` (sql/relay.sql): its outbox id and the record it becomes.

    A named tuple: tens of thousands are built per second on the relay's hot path."""

    id: int
    topic: str
    key: bytes
    value: bytes
    headers: Headers
    slot: int = 0
    """The key's slot (`OutboxTables.key_slot_function`): which lane, and so which relay,
    publishes it."""

    @property
    def size(self) -> int:
        """Bytes it holds in the relay's in-flight window (key and value)."""
        return len(self.key) + len(self.value)


def record_from_row(row: TupleRow) -> OutboxRecord:
    id_, topic, key, payload, raw_headers, slot = row
    return OutboxRecord(
        id=id_,
        topic=topic,
        key=key.encode(),
        value=bytes(payload),
        headers=_headers(raw_headers),
        slot=slot,
    )


_HeaderPairs = list[tuple[str, str | None]]
_BATCH_HEADERS: Final = msgspec.json.Decoder(list[_HeaderPairs])


def records_from_rows(rows: Sequence[TupleRow]) -> list[OutboxRecord]:
    """`record_from_row` of a whole read, in bulk: no Python step per row.

    The relay's hot path (a few microseconds per row was most of the reader's time): the
    columns are transposed (`zip`), the read's joined header texts decoded in one msgspec
    call, keys encoded by `map`, and each record built by `tuple.__new__` (a named tuple's
    own constructor is a Python function). A read with a header set of another shape (an
    object, non-string values, anything unreadable) falls back to row by row for the
    headers.
    """
    if not rows:
        return []
    ids, topics, keys, payloads, raw_headers, slots = zip(*rows, strict=True)
    # str values are what the producer takes; the type only widens to Headers.
    read = read_untrusted(_BATCH_HEADERS, "[" + ",".join(raw_headers) + "]")
    headers: Sequence[Headers] = (
        [_headers(raw, id_) for raw, id_ in zip(raw_headers, ids, strict=True)]
        if isinstance(read, Unreadable)
        else cast("list[Headers]", read)
    )
    keys_bytes, values = map(str.encode, keys), map(bytes, payloads)
    columns = zip(ids, topics, keys_bytes, values, headers, slots, strict=True)
    return list(map(_new_record, columns))


_new_record = cast(
    "Callable[[tuple[Any, ...]], OutboxRecord]", partial(tuple.__new__, OutboxRecord)
)


def _headers(raw: object, id_: int | None = None) -> Headers:
    """jsonb `[[name, value], ...]` (or an object, the column default) as Kafka headers.

    Read as text (`headers::text`) and decoded by msgspec straight into (name, value) pairs:
    the producer takes str values as they are, so no row costs a Python loop here. A value
    of another JSON type goes out as its JSON text. Never raises: headers that cannot be
    read at all (nested deeper than msgspec reads, which jsonb admits) are left off the
    record, with a warning naming the row; its key and value go out as stored.
    """
    if isinstance(raw, str | bytes):
        decoded = read_untrusted(_PAIRS, raw)
        if not isinstance(decoded, Unreadable):
            # str values are what the producer takes; the type only widens to Headers.
            return cast("Headers", decoded)
        as_pairs = read_untrusted(_ANY_PAIRS, raw)
        if not isinstance(as_pairs, Unreadable):
            return [(name, _header_value(value)) for name, value in as_pairs]
        as_object = read_untrusted(_ANY_OBJECT, raw)
        if not isinstance(as_object, Unreadable):
            return [(name, _header_value(value)) for name, value in as_object.items()]
        log_event(
            _log,
            "outbox-headers-unreadable",
            logging.WARNING,
            outboxId=id_,
            reason=decoded.reason,
        )
        return []
    pairs_: Any = raw.items() if isinstance(raw, dict) else (raw or [])
    return [(str(name), None if value is None else str(value).encode()) for name, value in pairs_]


_PAIRS: Final = msgspec.json.Decoder(_HeaderPairs)
_ANY_PAIRS: Final = msgspec.json.Decoder(list[tuple[str, msgspec.Raw]])
_ANY_OBJECT: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TEXT: Final = msgspec.json.Decoder(str | None)


def _header_value(raw: msgspec.Raw) -> bytes | None:
    """A header's stored JSON value as the header's bytes: text as it is, null as no value,
    any other value (a number of any size, an object) as its JSON text."""
    text = read_untrusted(_TEXT, raw)
    if isinstance(text, Unreadable):
        return bytes(raw)
    return None if text is None else text.encode()


def span_links(records: Sequence[OutboxRecord]) -> list[Link]:
    """Links to the transactions that wrote the rows (their stored `traceparent`).

    Whether any row carries a traceparent is decided first, in one C-level pass over the
    header names (a read written without a trace context, the common case where tracing is
    off, costs only that). Then a read of a fan-out shares one or a few traceparents: each
    row's is looked up in bulk (`map` over dicts of its headers, no Python step per row) and
    each distinct value is parsed once, from the headers of the first row that carries it,
    in read order.
    """
    headers = list(map(_HEADERS, records))
    if not any(map(TRACEPARENT.__eq__, map(_NAME, chain.from_iterable(headers)))):
        return []
    traceparents = list(map(_TRACEPARENT, map(dict, headers)))
    links: list[Link] = []
    seen: set[tuple[int, int]] = set()
    for traceparent in dict.fromkeys(traceparents):  # distinct, in order of appearance
        if not traceparent:
            continue
        first = headers[traceparents.index(traceparent)]
        context = trace.get_current_span(extract_context(first)).get_span_context()
        if context.is_valid and (context.trace_id, context.span_id) not in seen:
            seen.add((context.trace_id, context.span_id))
            links.append(Link(context))
            if len(links) >= MAX_SPAN_LINKS:
                break
    return links


TRACEPARENT: Final = "traceparent"
_HEADERS = attrgetter("headers")
_NAME = itemgetter(0)
_TRACEPARENT = methodcaller("get", TRACEPARENT)
