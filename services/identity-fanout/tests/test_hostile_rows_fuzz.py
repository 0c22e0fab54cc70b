"""No stored bytes stop the relay: outbox rows whose header sets are anything jsonb holds
(nested up to 100,000 deep, numbers beyond int64 and float, duplicate names, objects where
pairs belong) become records, in bulk as row by row, and never raise.

No services: a few hundred examples in `make test` take seconds; `make fuzz` runs ten
thousand (PIN_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from identity_fanout.outbox.records import record_from_row, records_from_rows, span_links
from pin_testkit.fuzzing import fuzz_settings
from pin_testkit.hostile_bytes import nested, scalars

_names = st.one_of(st.sampled_from(["traceparent", "pin-message-id", "a"]), st.text(max_size=8))
_values = st.one_of(scalars, nested())
_pair = st.builds(lambda n, v: b"[" + msgspec.json.encode(n) + b"," + v + b"]", _names, _values)
_member = st.builds(lambda n, v: msgspec.json.encode(n) + b":" + v, _names, _values)
header_texts = st.one_of(
    st.lists(_pair, max_size=4).map(lambda pairs: b"[" + b",".join(pairs) + b"]"),
    st.lists(_member, max_size=4).map(lambda members: b"{" + b",".join(members) + b"}"),
    nested(),
).map(lambda text: text.decode("utf-8", errors="replace"))  # jsonb's text is UTF-8
"""A stored header set as `headers::text` gives it: well-formed or not (the relay does not
trust even its own table to be what its writer meant)."""


@fuzz_settings()
@given(texts=st.lists(header_texts, min_size=1, max_size=4), key=st.text(max_size=40))
def test_any_stored_header_set_becomes_a_record(texts: list[str], key: str) -> None:
    rows = [(n, "pin.identity.access.v1", key, b"{}", text, n) for n, text in enumerate(texts)]
    records = records_from_rows(rows)
    assert records == [record_from_row(row) for row in rows]
    for record in records:
        assert record.key == key.encode()
        for name, value in record.headers:
            assert isinstance(name, str)
            assert value is None or isinstance(value, str | bytes)
    span_links(records)
