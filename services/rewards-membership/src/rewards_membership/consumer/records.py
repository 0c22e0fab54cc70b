"""Typed accessors of a consumed confluent-kafka `Message` (its getters are all optional)."""

from __future__ import annotations

from confluent_kafka import Message

from pin_contracts import Headers

__all__ = ["headers_of", "key_text", "offset_of", "partition_of", "topic_of"]


def partition_of(message: Message) -> int:
    partition = message.partition()
    if partition is None:
        raise ValueError("consumed message without a partition")
    return partition


def offset_of(message: Message) -> int:
    offset = message.offset()
    if offset is None:
        raise ValueError("consumed message without an offset")
    return offset


def topic_of(message: Message) -> str:
    return message.topic() or ""


def headers_of(message: Message) -> Headers:
    raw = message.headers()
    if raw is None:
        return []
    if isinstance(raw, dict):
        return list(raw.items())
    return list(raw)


def key_text(message: Message) -> str | None:
    key: object = message.key()
    if key is None:
        return None
    if isinstance(key, str):
        return key
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key).decode("utf-8", errors="replace")
    return str(key)
