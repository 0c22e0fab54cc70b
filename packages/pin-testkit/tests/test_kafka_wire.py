"""The framing `pin_testkit.kafka_wire` writes, checked against the protocol's own examples
(no broker: `test_kafka_integration.py` of pin-runtime and rewards' hostile records
write through it to a real one)."""

from __future__ import annotations

import struct

from pin_testkit.kafka_wire import crc32c, record_batch


def test_crc32c_is_castagnolis() -> None:
    # The check value of CRC-32C (RFC 3720 B.4 and every CRC catalogue).
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_a_record_batch_carries_its_bytes_as_given() -> None:
    batch = record_batch([(None, b"v", [(b"\xff\xfe", None)]), (b"k", None, [])], timestamp_ms=7)
    base_offset, length, _epoch, magic, crc = struct.unpack_from(">qiibI", batch)
    assert (base_offset, magic, length) == (0, 2, len(batch) - 12)
    assert crc == crc32c(batch[21:])  # attributes to the end
    last_delta, base_ts, max_ts, producer, _, _, count = struct.unpack_from(">iqqqhii", batch, 23)
    assert (last_delta, base_ts, max_ts, producer, count) == (1, 7, 7, -1, 2)
    # Zigzag varints: record 0, 11 bytes (22): attributes, timestamp delta 0, offset delta
    # 0, no key (-1: 1), value b"v", one header: its name b"\xff\xfe" as it is, value null;
    # record 1, 7 bytes (14): offset delta 1, key b"k", null value, no header.
    assert batch[61:] == (
        b"\x16\x00\x00\x00\x01\x02v\x02\x04\xff\xfe\x01" + b"\x0e\x00\x00\x02\x02k\x01\x00"
    )
