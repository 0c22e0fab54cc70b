"""Conventions every PIN event Struct shares: the base Struct and the constrained scalars."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

import msgspec

__all__ = [
    "EMPTY_GUID",
    "INT32_MAX",
    "INT64_MAX",
    "AwareDatetime",
    "ContractVersionInt",
    "VersionInt",
    "WireStruct",
    "is_empty_guid",
]

# .NET producers and PostgreSQL store these as int / bigint; larger numbers are garbage.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]
"""RFC 3339 timestamp with an offset (``DateTimeOffset``); a naive one is a violation."""

VersionInt = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
"""Monotonic aggregate version (``long``, >= 1)."""

ContractVersionInt = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]

EMPTY_GUID = UUID(int=0)


def is_empty_guid(value: UUID) -> bool:
    """True for ``Guid.Empty``: it decodes fine, and consumers decide whether it is a violation."""
    return value == EMPTY_GUID


class WireStruct(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="pascal",
    # Additive fields written by a newer producer must never break an older reader.
    forbid_unknown_fields=False,
    # Nullable fields go on the wire as explicit nulls, which .NET readers expect.
    omit_defaults=False,
):
    """Base of every wire Struct: snake_case in Python, PascalCase on the wire."""
