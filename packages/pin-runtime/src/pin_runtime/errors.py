"""The one error tree of pin-runtime: catch `PinRuntimeError` to catch all of it."""

from __future__ import annotations

__all__ = [
    "DeliveryError",
    "KafkaSetupError",
    "KafkaUnreachableError",
    "MigrationError",
    "PinRuntimeError",
    "SettingsError",
]


class PinRuntimeError(Exception):
    """Something the shared runtime refused or could not do."""


class SettingsError(PinRuntimeError):
    """A configuration value is missing or wrong; `variable` names the exact env var."""

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{variable}: {reason}")
        self.variable = variable
        self.reason = reason


class MigrationError(PinRuntimeError):
    """The migration set or the migrations table is inconsistent (a bug, not an outage)."""


class KafkaSetupError(PinRuntimeError):
    """Topics could not be created or did not become available in time."""


class KafkaUnreachableError(KafkaSetupError):
    """No broker answered in time: an outage a process may wait out (unlike a refused login)."""


class DeliveryError(PinRuntimeError):
    """Messages were not acknowledged by the broker (failed or still queued after flush)."""
