"""Outbox rows as Kafka records: a whole read's headers decoded at once, odd shapes one by one."""

from __future__ import annotations

from identity_fanout.relay_records import OutboxRecord, record_from_row, records_from_rows


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
