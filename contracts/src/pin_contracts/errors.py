"""The errors of pin-contracts: one root, one class per side of the wire."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ContractError",
    "ContractViolation",
    "InvalidEventError",
    "UnknownEnumValueError",
]


class ContractError(Exception):
    """Root of every error pin-contracts raises, so callers can catch the package at once."""


# The name is the specs' word for the condition (it routes a record to the DLQ), so it
# deliberately lacks the "Error" suffix.
class ContractViolation(ContractError):  # noqa: N818
    """Bytes read from the wire do not satisfy the contract (non-retriable: DLQ them)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class InvalidEventError(ContractError):
    """A producer built an event the contract forbids; nothing was encoded."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class UnknownEnumValueError(InvalidEventError):
    """A producer tried to emit a value its enum does not define."""

    def __init__(self, path: str, enum_type: type[StrEnum], raw: str) -> None:
        known = ", ".join(member.value for member in enum_type)
        super().__init__(path, f"{raw!r} is not a {enum_type.__name__} (known: {known})")
        self.enum_type = enum_type
        self.raw = raw
