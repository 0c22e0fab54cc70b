"""Reading JSON nobody vouches for (a record the contract refused, a dead letter's value,
a stored header set) without ever raising.

Every way msgspec can fail on hostile bytes is caught here, in one place: a malformed or
mistyped document (`MsgspecError`), nesting deeper than the interpreter's recursion limit
(`RecursionError`: msgspec recurses into every value, unknown fields included, so the depth
is the sender's to choose), text that is not Unicode (`UnicodeError`). The caller gets the
value or an `Unreadable` naming why, and goes on.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import msgspec

__all__ = ["Unreadable", "read_untrusted"]

T = TypeVar("T")


class Unreadable(NamedTuple):
    """Why a document could not be read as the type asked for."""

    reason: str


def read_untrusted(decoder: msgspec.json.Decoder[T], data: bytes | str) -> T | Unreadable:
    """`decoder.decode(data)`, or why not: never raises, whatever `data` holds."""
    try:
        return decoder.decode(data)
    except RecursionError:
        return Unreadable("JSON nested too deeply")
    except (msgspec.MsgspecError, UnicodeError) as exc:
        return Unreadable(str(exc))
