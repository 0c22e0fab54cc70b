"""Building one msgspec Struct from another value that carries the same fields.

A row type and the event built from it (a membership row and its AgentMembershipChanged, an
assignment row and its snapshot, a batch result and the step the walk logs) share most of
their field names: `built_from`
copies the shared ones, so each mapping names only the fields that differ, and a field
added to both types is carried over without an edit.

It costs several times a spelled-out constructor (keyword arguments built at run time;
the figures are in the README's row of this module): for a mapping done once per row of a
large read, spell it out.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

__all__ = ["built_from"]

T = TypeVar("T", bound=msgspec.Struct)

_MISSING = object()


def built_from(target: type[T], source: object, **values: Any) -> T:
    """A `target` whose fields are `values`, else `source`'s attribute of the same name,
    else the field's default (a required field `source` lacks is a TypeError)."""
    fields: dict[str, Any] = {}
    for name in target.__struct_fields__:
        value = values[name] if name in values else getattr(source, name, _MISSING)
        if value is not _MISSING:
            fields[name] = value
    return target(**fields)
