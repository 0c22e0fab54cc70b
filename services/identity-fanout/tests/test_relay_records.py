"""Outbox rows as Kafka records: a whole read's headers decoded at once, odd shapes one by one."""

from __future__ import annotations

from identity_fanout.outbox.records import (
    OutboxRecord,
    record_from_row,
    records_from_rows,
    span_links,
)


def row(id_: int, headers: str) -> tuple[int, str, str, bytes, str, int]:
    return (id_, "pin.identity.access.v1", f"user-{id_}", b'{"v":%d}' % id_, headers, id_ % 64)


def test_a_read_becomes_records_in_order_with_their_own_headers() -> None:
    rows = [row(n, f'[["pin-message-id","m{n}"],["traceparent",null]]') for n in range(1, 4)]
    records = records_from_rows(rows)
    assert records == [
        OutboxRecord(
            n,
            "pin.identity.access.v1",
            f"user-{n}".encode(),
            b'{"v":%d}' % n,
            [("pin-message-id", f"m{n}"), ("traceparent", None)],
            n % 64,
        )
        for n in range(1, 4)
    ]
    assert records == [record_from_row(r) for r in rows]


def test_a_read_with_an_object_or_a_non_string_value_falls_back_row_by_row() -> None:
    rows = [
        row(1, '[["pin-message-id","m1"]]'),
        row(2, "{}"),  # the column's default
        row(3, '{"pin-attempt": 2}'),
        row(4, '[["pin-attempt", 3]]'),
    ]
    records = records_from_rows(rows)
    assert [r.headers for r in records] == [
        [("pin-message-id", "m1")],
        [],
        [("pin-attempt", b"2")],
        [("pin-attempt", b"3")],
    ]
    assert records == [record_from_row(r) for r in rows]


def test_an_empty_read_is_no_records() -> None:
    assert records_from_rows([]) == []


def test_span_links_one_per_distinct_writer_context_in_read_order() -> None:
    first = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    second = "00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
    records = [
        OutboxRecord(1, "t", b"a", b"v", [("pin-message-id", "m1"), ("traceparent", second)]),
        OutboxRecord(2, "t", b"b", b"v", [("pin-message-id", "m2")]),  # written untraced
        OutboxRecord(3, "t", b"c", b"v", [("traceparent", first), ("pin-message-id", "m3")]),
        OutboxRecord(4, "t", b"d", b"v", [("traceparent", second)]),
        OutboxRecord(5, "t", b"e", b"v", [("traceparent", "not-a-traceparent")]),
    ]
    links = span_links(records)
    assert [
        (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in links
    ] == [
        ("1bf7651916cd43dd8448eb211c80319c", "c7ad6b7169203331"),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),
    ]
    assert span_links(records[1:2]) == []
