"""Records written in Kafka's own protocol, for bytes no client library will write.

confluent-kafka's producer takes header names as text: a `bytes` name is written as its
`str()` (`b'\\xff'` arrives as the name "b'\\xff'"), so a header name that is not UTF-8
cannot be produced through it, though any producer in another language (or a broken one)
can put one on a topic, and librdkafka hands it to the consumer as it came. `produce_wire`
writes such records: one ProduceRequest (v3..v8, the versions without tagged fields) with
one record batch (magic 2, uncompressed, not transactional) straight to the partition's
leader, every byte of the keys, values and header names as given. Plaintext listeners only:
what the test brokers run.

Pure Python, no client library of its own: the brokers' metadata is asked through
confluent-kafka, the rest is the protocol's framing (KIP-98 record batches, CRC-32C).
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections.abc import Sequence
from typing import Final

from confluent_kafka.admin import AdminClient

__all__ = ["WireHeaders", "WireRecord", "crc32c", "produce_wire", "record_batch"]

WireHeaders = Sequence[tuple[bytes, bytes | None]]
"""Header names and values as bytes, exactly as they go on the wire (a value may be null)."""
WireRecord = tuple[bytes | None, bytes | None, WireHeaders]
"""Key, value and headers of one record."""

_PRODUCE: Final = 0
_API_VERSIONS: Final = 18
_PRODUCE_VERSIONS: Final = range(3, 9)
"""Record batches (magic 2) from v3 on; v9 on are flexible (tagged fields)."""
_ACKS_ALL: Final = -1
_RETRIABLE: Final = {3, 5, 6}
"""UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER: a topic just
created whose leader the metadata does not show yet; asked again until the deadline."""
_CLIENT_ID: Final = b"pin-testkit-wire"
_correlation = itertools.count(1)


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C: Final = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of a record batch."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _varint(number: int) -> bytes:
    """A zigzag-encoded variable-length integer (protobuf's), as records use them."""
    zigzag = (number << 1) ^ (number >> 63)
    out = bytearray()
    while True:
        low = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _varbytes(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def _record(
    offset_delta: int, key: bytes | None, value: bytes | None, headers: WireHeaders
) -> bytes:
    body = b"".join(
        [
            b"\x00",  # attributes (unused)
            _varint(0),  # timestamp delta: every record at the batch's base timestamp
            _varint(offset_delta),
            _varbytes(key),
            _varbytes(value),
            _varint(len(headers)),
            *(_varint(len(name)) + name + _varbytes(data) for name, data in headers),
        ]
    )
    return _varint(len(body)) + body


def record_batch(records: Sequence[WireRecord], *, timestamp_ms: int | None = None) -> bytes:
    """One uncompressed record batch (magic 2) holding `records`, offsets from 0."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    # attributes .. the records: what the CRC covers.
    checked = struct.pack(
        ">hiqqqhii",
        0,  # attributes: no compression, CreateTime, not transactional, no control
        len(records) - 1,  # last offset delta
        now,  # base timestamp
        now,  # max timestamp
        -1,  # producer id: not idempotent
        -1,  # producer epoch
        -1,  # base sequence
        len(records),
    ) + b"".join(_record(i, *record) for i, record in enumerate(records))
    # partition leader epoch, magic, crc: the rest of the batch after its length.
    after_length = struct.pack(">ibI", -1, 2, crc32c(checked)) + checked
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _string(text: bytes) -> bytes:
    return struct.pack(">h", len(text)) + text


def _request(api_key: int, version: int, body: bytes) -> bytes:
    correlation = next(_correlation) & 0x7FFFFFFF
    header = struct.pack(">hhi", api_key, version, correlation) + _string(_CLIENT_ID)
    return struct.pack(">i", len(header) + len(body)) + header + body


def _exchange(connection: socket.socket, request: bytes) -> bytes:
    """Send one request, return the response after its correlation id."""
    connection.sendall(request)
    (size,) = struct.unpack(">i", _read(connection, 4))
    return _read(connection, size)[4:]


def _read(connection: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = connection.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks += chunk
    return bytes(chunks)


def _produce_version(connection: socket.socket) -> int:
    """The highest ProduceRequest version both sides speak (ApiVersions v0)."""
    response = _exchange(connection, _request(_API_VERSIONS, 0, b""))
    error, count = struct.unpack_from(">hi", response, 0)
    if error:
        raise ConnectionError(f"ApiVersions refused: error {error}")
    for index in range(count):
        api, low, high = struct.unpack_from(">hhh", response, 6 + 6 * index)
        if api == _PRODUCE:
            usable = [v for v in _PRODUCE_VERSIONS if low <= v <= high]
            if usable:
                return usable[-1]
            raise ConnectionError(f"the broker speaks Produce v{low}..v{high} only")
    raise ConnectionError("the broker does not take Produce requests")


def _produce_body(topic: str, partition: int, batch: bytes, timeout_ms: int) -> bytes:
    return b"".join(
        [
            struct.pack(">h", -1),  # transactional id: null
            struct.pack(">hi", _ACKS_ALL, timeout_ms),
            struct.pack(">i", 1),
            _string(topic.encode()),
            struct.pack(">ii", 1, partition),
            struct.pack(">i", len(batch)),
            batch,
        ]
    )


def _produce_answer(response: bytes) -> tuple[int, int]:
    """(error code, base offset) of the one partition a request wrote."""
    (name_length,) = struct.unpack_from(">h", response, 4)  # after the topic count
    at = 6 + name_length + 4  # after the name and the partition count
    _partition, error, base_offset = struct.unpack_from(">ihq", response, at)
    return error, base_offset


def _leader(admin: AdminClient, topic: str, partition: int, timeout: float) -> tuple[str, int]:
    metadata = admin.list_topics(topic, timeout=timeout)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        raise ConnectionError(f"topic {topic} unknown: {described and described.error}")
    if partition not in described.partitions:
        raise ValueError(f"topic {topic} has no partition {partition}")
    leader = described.partitions[partition].leader
    broker = metadata.brokers.get(leader)
    if broker is None:
        raise ConnectionError(f"{topic}[{partition}] has no leader yet")
    host: object = broker.host  # typed None by the library; a name once the broker is known
    return str(host), broker.port


def produce_wire(
    bootstrap: str,
    topic: str,
    partition: int,
    records: Sequence[WireRecord],
    *,
    timeout: float = 30.0,
) -> list[int]:
    """Write `records`, in order, to `topic[partition]` as one batch acknowledged by every
    in-sync replica; the offset of each. Fails (AssertionError) unless the broker took them
    within `timeout`."""
    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    batch = record_batch(records)
    problem = "not tried"
    while time.monotonic() < deadline:
        remaining = max(0.5, deadline - time.monotonic())
        try:
            host, port = _leader(admin, topic, partition, remaining)
            with socket.create_connection((host, port), timeout=remaining) as connection:
                version = _produce_version(connection)
                body = _produce_body(topic, partition, batch, int(remaining * 1000))
                error, base = _produce_answer(
                    _exchange(connection, _request(_PRODUCE, version, body))
                )
        except (ConnectionError, OSError) as exc:
            problem = str(exc)
        else:
            if error == 0:
                return [base + i for i in range(len(records))]
            problem = f"error code {error}"
            if error not in _RETRIABLE:
                break
        time.sleep(0.1)  # a leader being elected: the metadata has no change to wait on
    raise AssertionError(f"produce to {topic}[{partition}] by the wire protocol: {problem}")
