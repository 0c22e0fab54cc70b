from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest

from pin_runtime.structs import built_from


class Event(msgspec.Struct, frozen=True, kw_only=True):
    event_id: int
    name: str
    note: str = "none"


@dataclass
class Row:
    id: int
    name: str
    extra: str = "ignored"


def test_shared_fields_are_copied_and_the_others_given() -> None:
    assert built_from(Event, Row(7, "a"), event_id=7) == Event(event_id=7, name="a")


def test_a_given_value_wins_over_the_source() -> None:
    assert built_from(Event, Row(7, "a"), event_id=1, name="b", note="n") == Event(
        event_id=1, name="b", note="n"
    )


def test_a_required_field_neither_given_nor_in_the_source_is_an_error() -> None:
    with pytest.raises(TypeError, match="event_id"):
        built_from(Event, Row(7, "a"))
