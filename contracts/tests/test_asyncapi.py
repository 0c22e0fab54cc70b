"""contracts/asyncapi.yaml: what the code generates from the catalogue, and what it says."""

from __future__ import annotations

from pathlib import Path

import yaml

from pin_contracts import CATALOGUE, DLQ_HEADERS, MESSAGE_ID_HEADER
from pin_contracts.asyncapi import DEFAULT_PATH, generate, main, render


def test_the_committed_document_is_the_generated_one() -> None:
    assert DEFAULT_PATH.read_text(encoding="utf-8") == render(generate())
    assert main(["check"]) == 0


def test_a_stale_document_fails_the_check(tmp_path: Path) -> None:
    stale = tmp_path / "asyncapi.yaml"
    stale.write_text(render(generate(version="0.0.1")), encoding="utf-8")
    assert main(["check", "--path", str(stale)]) == 1


def test_every_topic_is_a_channel_with_its_key_partitions_and_schema() -> None:
    document = yaml.safe_load(render(generate()))
    assert document["asyncapi"].startswith("3.")
    channels = {c["address"]: c for c in document["channels"].values()}
    assert set(channels) == {topic.name for topic in CATALOGUE}
    messages = document["components"]["messages"]
    for topic in CATALOGUE:
        channel = channels[topic.name]
        assert channel["bindings"]["kafka"]["partitions"] == topic.partitions
        config = channel["bindings"]["kafka"]["topicConfiguration"]
        assert config["max.message.bytes"] == topic.max_message_bytes
        [reference] = channel["messages"].values()
        message = messages[reference["$ref"].rpartition("/")[2]]
        schema = DEFAULT_PATH.parent / message["payload"]["schema"]["$ref"]
        assert schema.is_file(), schema
        assert topic.key_field in message["bindings"]["kafka"]["key"]["description"]
        headers = message["headers"]["properties"]
        assert MESSAGE_ID_HEADER in headers
        assert (set(DLQ_HEADERS) <= set(headers)) == (topic.dead_letter_of is not None)
    operations = document["operations"].values()
    received = [op for op in operations if op["action"] == "receive"]
    assert [op["bindings"]["kafka"]["groupId"]["const"] for op in received] == [
        "pin-rewards-identity-membership"
    ]
