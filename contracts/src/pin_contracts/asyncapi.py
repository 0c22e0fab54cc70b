"""`contracts/asyncapi.yaml`: the AsyncAPI 3.1 document of the identity events, generated
from the topic catalogue (`topics.CATALOGUE`), the header names (`kafka`, `dlq`) and the
JSON Schemas of `schemas/` (referenced, not copied: one description of each payload). Each
payload declares the dialect its schema file declares (`$schema`: draft 2020-12, what
msgspec writes) as its `schemaFormat`.

The wheel ships it in the package's folder (pin_contracts), beside the schemas it references
(`pin_contracts/json_schemas/`): the build (hatch_build.py) writes the `$ref`s of that copy
relative to it, `./json_schemas/<file>` for `./schemas/<file>`.

Tooling, as `pin_contracts.schemas` (not re-exported); needs PyYAML (a development
dependency). `python -m pin_contracts.asyncapi write` regenerates it, `check` exits 1 when
the committed file differs from what the code generates (`make lint` runs it, like the
schemas' check); `infra/checks/asyncapi.sh` validates it with the AsyncAPI parser.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from pin_contracts.dlq import DLQ_HEADERS
from pin_contracts.kafka import (
    CONTRACT_VERSION_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
)
from pin_contracts.schemas import DEFAULT_SCHEMA_DIR, EVENT_PAYLOAD_TYPES, schema_file_name
from pin_contracts.topics import CATALOGUE, REWARDS_MEMBERSHIP_CONSUMER_GROUP, Topic

__all__ = ["DEFAULT_PATH", "SCHEMA_FORMATS", "generate", "main", "render", "schema_format"]

DEFAULT_PATH: Final = DEFAULT_SCHEMA_DIR.parent / "asyncapi.yaml"
SCHEMA_FORMATS: Final = {
    "https://json-schema.org/draft/2020-12/schema": "application/schema+json;version=draft-2020-12",
    "http://json-schema.org/draft-07/schema#": "application/schema+json;version=draft-07",
}
"""A schema file's `$schema` -> the `schemaFormat` of a payload it describes."""
_KAFKA_BINDING: Final = "0.5.0"

# Who writes and who reads each topic: the operations of the document.
_SENDERS: Final = {
    "pin.identity.access.v1": "identity-fanout (its outbox relay)",
    "pin.identity.agent-membership-changed.v1": "identity-fanout (its outbox relay)",
    "pin.rewards.identity-membership-dlq.v1": "rewards-membership (dead letters)",
}
_RECEIVERS: Final = {
    "pin.identity.agent-membership-changed.v1": REWARDS_MEMBERSHIP_CONSUMER_GROUP,
}

_HEADER_TEXT: Final = {
    EVENT_TYPE_HEADER: "The envelope's EventType.",
    CONTRACT_VERSION_HEADER: "The envelope's ContractVersion, as decimal text.",
    MESSAGE_ID_HEADER: "The envelope's MessageId (the consumers' idempotency key).",
    TRACEPARENT_HEADER: "W3C trace context of the transaction that wrote the event, if traced.",
    TRACESTATE_HEADER: "W3C tracestate, only with a traceparent.",
}


def _channel_id(topic: Topic) -> str:
    return topic.name.removeprefix("pin.").replace(".", "-")


def _message_id(topic: Topic) -> str:
    return f"{topic.event_type}DeadLetter" if topic.dead_letter_of else topic.event_type


def _headers(topic: Topic) -> dict[str, Any]:
    names = [EVENT_TYPE_HEADER, CONTRACT_VERSION_HEADER, MESSAGE_ID_HEADER]
    properties: dict[str, Any] = {
        name: {"type": "string", "description": _HEADER_TEXT[name]} for name in names
    }
    for name in (TRACEPARENT_HEADER, TRACESTATE_HEADER):
        properties[name] = {"type": "string", "description": _HEADER_TEXT[name]}
    if topic.dead_letter_of:
        for name in sorted(DLQ_HEADERS):
            properties[name] = {"type": "string", "description": "Dead-letter header."}
    return {"type": "object", "required": names, "properties": properties}


def schema_format(schema_file: Path) -> str:
    """The `schemaFormat` of the dialect `schema_file` declares; ValueError for another."""
    dialect = json.loads(schema_file.read_text(encoding="utf-8")).get("$schema")
    try:
        return SCHEMA_FORMATS[dialect]
    except KeyError:
        raise ValueError(f"{schema_file.name}: no schemaFormat for $schema {dialect!r}") from None


def _message(topic: Topic, schema_files: dict[str, str]) -> dict[str, Any]:
    source = topic.dead_letter_of or topic.name
    description = (
        f"A record of {source} the consumer refused, with the same key, value and headers "
        "and the dead-letter headers."
        if topic.dead_letter_of
        else f"One {topic.event_type} event (ContractVersion {topic.contract_version})."
    )
    return {
        "name": _message_id(topic),
        "title": topic.event_type,
        "summary": description,
        "contentType": "application/json",
        "headers": _headers(topic),
        "payload": {
            "schemaFormat": schema_format(DEFAULT_SCHEMA_DIR / schema_files[topic.event_type]),
            "schema": {"$ref": f"./schemas/{schema_files[topic.event_type]}"},
        },
        "bindings": {
            "kafka": {
                "key": {
                    "type": "string",
                    "format": "uuid",
                    "description": (
                        f"The payload's {topic.key_field}. "
                        + (
                            "The source record's key."
                            if topic.dead_letter_of
                            else "A key's records come in the order their outbox rows took "
                            "their ids: commit order where the producer's writers serialize "
                            "the key; at least once, so a record may repeat (README "
                            '"Record key").'
                        )
                    ),
                },
                "bindingVersion": _KAFKA_BINDING,
            }
        },
    }


def _operation_refs(channel: str, message: str) -> dict[str, Any]:
    # Built anew for each operation: a shared dict would be dumped as a YAML anchor.
    return {
        "channel": {"$ref": f"#/channels/{channel}"},
        "messages": [{"$ref": f"#/channels/{channel}/messages/{message}"}],
    }


def generate(version: str | None = None) -> dict[str, Any]:
    """The document for the catalogue as it is now (`version`: the package's)."""
    schema_files = {p.EVENT_TYPE: schema_file_name(p) for p in EVENT_PAYLOAD_TYPES}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for topic in CATALOGUE:
        channel, message = _channel_id(topic), _message_id(topic)
        messages[message] = _message(topic, schema_files)
        channels[channel] = {
            "address": topic.name,
            "description": f"Key {topic.key_field}; {topic.partitions} partitions.",
            "messages": {message: {"$ref": f"#/components/messages/{message}"}},
            "bindings": {
                "kafka": {
                    "topic": topic.name,
                    "partitions": topic.partitions,
                    "topicConfiguration": {
                        "max.message.bytes": topic.max_message_bytes,
                    },
                    "bindingVersion": _KAFKA_BINDING,
                }
            },
        }
        operations[f"send-{channel}"] = {
            "action": "send",
            "summary": f"Written by {_SENDERS[topic.name]}.",
            **_operation_refs(channel, message),
        }
        group = _RECEIVERS.get(topic.name)
        if group is not None:
            operations[f"receive-{channel}"] = {
                "action": "receive",
                "summary": f"Read by rewards-membership, consumer group {group}.",
                **_operation_refs(channel, message),
                "bindings": {
                    "kafka": {
                        "groupId": {"type": "string", "const": group},
                        "bindingVersion": _KAFKA_BINDING,
                    }
                },
            }
    return {
        "asyncapi": "3.1.0",
        "info": {
            "title": "PIN identity events",
            "version": version or importlib.metadata.version("pin-contracts"),
            "description": (
                "The events identity publishes and their dead letters: UTF-8 JSON envelopes "
                "whose payload schemas are the JSON Schemas of pin-contracts (contracts/schemas/"
                "; pin_contracts/json_schemas/ in its wheel, beside this document). Readers "
                "accept unknown fields and unknown enum values."
            ),
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def render(document: dict[str, Any]) -> str:
    import yaml  # noqa: PLC0415 - tooling: a development dependency, not the package's

    header = "# Generated by `python -m pin_contracts.asyncapi write`: edit the code, not this.\n"
    return header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pin_contracts.asyncapi")
    parser.add_argument("command", choices=("check", "write"))
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH)
    args = parser.parse_args(argv)
    text = render(generate())
    path: Path = args.path
    if args.command == "write":
        path.write_text(text, encoding="utf-8")
        sys.stdout.write(f"wrote {path}\n")
        return 0
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        sys.stderr.write(
            f"{path} differs from the catalogue: python -m pin_contracts.asyncapi write\n"
        )
        return 1
    sys.stdout.write(f"{path} matches the catalogue and the schemas\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
