"""`TemplatedError`: every subclass carries its typed fields and says them in its message."""

from __future__ import annotations

import copy
from uuid import UUID

import pytest

from pin_runtime.errors import PinRuntimeError, SettingsError, TemplatedError

TASK = UUID(int=7)


class ServiceError(TemplatedError):
    """A root without fields, as a service declares one."""


class TaskNotFoundError(ServiceError):
    """Declared without `@dataclass`: made one as it is defined, so its one field is a
    required argument."""

    template = "task {task_id} does not exist"
    task_id: UUID


class TaskStuckError(TaskNotFoundError):
    """Inherits the field, says it differently."""

    template = "task {task_id} is stuck after {attempts} attempts"
    attempts: int


def test_a_subclass_is_a_dataclass_of_its_fields_without_a_decorator() -> None:
    error = TaskNotFoundError(TASK)
    assert error.task_id == TASK
    assert str(error) == f"task {TASK} does not exist"
    assert repr(error) == f"TaskNotFoundError('task {TASK} does not exist')"
    with pytest.raises(TypeError):
        TaskNotFoundError()  # type: ignore[call-arg]  # the field is required


def test_a_subclass_of_a_subclass_adds_fields_after_the_inherited_ones() -> None:
    error = TaskStuckError(TASK, 3)
    assert (error.task_id, error.attempts) == (TASK, 3)
    assert str(error) == f"task {TASK} is stuck after 3 attempts"
    assert isinstance(error, ServiceError)


def test_errors_compare_by_identity_and_copy_from_their_fields() -> None:
    assert TaskNotFoundError(TASK) != TaskNotFoundError(TASK)
    settings = SettingsError("PIN_X", "must be a number")
    assert isinstance(settings, PinRuntimeError)
    assert str(settings) == "PIN_X: must be a number"
    # Rebuilt from the fields (what pickle does too), not from the message.
    copied = copy.copy(TaskStuckError(TASK, 3))
    assert (copied.task_id, copied.attempts) == (TASK, 3)
    assert str(copied) == f"task {TASK} is stuck after 3 attempts"
