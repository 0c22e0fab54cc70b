"""The one error tree of pin-runtime: catch `PinRuntimeError` to catch all of it.

Also the form every error that carries values takes (`TemplatedError`), here and in the
packages built on pin-runtime: a dataclass naming its fields, and a message template.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, cast, dataclass_transform

__all__ = [
    "DeliveryError",
    "KafkaSetupError",
    "KafkaUnreachableError",
    "MigrationError",
    "NewerSchemaError",
    "PinRuntimeError",
    "SettingsError",
    "TemplatedError",
]


@dataclass_transform(eq_default=False)
class TemplatedError(Exception):
    """An error whose message is its `template` filled with its fields.

    A subclass declares the values it carries, typed, and the sentence they fill; it is
    made a dataclass of them as it is defined (`eq=False`: an error is raised and caught by
    identity, not compared; `repr=False`: its repr stays the exception's own,
    `Name('message')`), so no subclass can forget to be one:

        class TaskNotFoundError(ServiceError):
            template = "fan-out task {task_id} does not exist"
            task_id: UUID

    `TaskNotFoundError(task_id)` then has `.task_id` and that message. A message that is
    more than a template overrides `describe`.
    """

    template: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclass(eq=False, repr=False)(cls)

    def __post_init__(self) -> None:
        super().__init__(self.describe())

    def __reduce__(self) -> tuple[type[TemplatedError], tuple[object, ...]]:
        # Rebuilt from its fields: Exception's own reduce would pass the message back in
        # as the first field (pickle, copy, a process pool's result).
        return type(self), tuple(getattr(self, f.name) for f in fields(cast("Any", self)) if f.init)

    def describe(self) -> str:
        """The message: `template` over the fields."""
        return self.template.format_map(vars(self))


class PinRuntimeError(Exception):
    """Something the shared runtime refused or could not do."""


class SettingsError(PinRuntimeError, TemplatedError):
    """A configuration value is missing or wrong; `variable` names the exact env var."""

    template = "{variable}: {reason}"
    variable: str
    reason: str


class MigrationError(PinRuntimeError):
    """The migration set or the migrations table is inconsistent (a bug, not an outage)."""


class NewerSchemaError(MigrationError, TemplatedError):
    """`migrate` refused, changing nothing: the migrations table holds migrations this code
    does not have, so a newer release migrated the schema. Migrating it again would set the
    runtime roles' grants from this older declaration, under the newer code still running."""

    template = (
        "the {schema} schema is newer than this release: it has migration(s) {migrations} "
        "that this release does not have; nothing changed. Migrate with the newer release, or "
        "roll the code back without migrating (the newer schema runs this release)"
    )
    schema: str
    migrations: str


class KafkaSetupError(PinRuntimeError):
    """Topics could not be created or did not become available in time."""


class KafkaUnreachableError(KafkaSetupError):
    """No broker answered in time: an outage a process may wait out (unlike a refused login)."""


class DeliveryError(PinRuntimeError):
    """Messages were not acknowledged by the broker (failed or still queued after flush)."""
