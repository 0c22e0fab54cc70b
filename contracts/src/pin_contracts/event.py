"""The base of an event payload: the class states its facts once, the rest derives from them.

The envelope's EventType, ContractVersion, AggregateType and AggregateId, the Kafka record
key and the topic catalogue's ``key_field`` all read these class-level facts; nothing
repeats them.
"""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

import msgspec

from pin_contracts.wire import WireStruct

__all__ = ["EventStruct"]


class EventStruct(WireStruct, frozen=True, kw_only=True):
    """Base of a payload Struct (adds no wire field: the encoding is the subclass's own).

    A subclass sets the ClassVars below (``KEY_FIELD`` only where the key is not the
    aggregate's id); ``AGGREGATE_ID_FIELD`` and ``KEY_FIELD`` name UUID fields of it by their
    Python name (a test checks each names one).
    """

    EVENT_TYPE: ClassVar[str]
    CONTRACT_VERSION: ClassVar[int]
    AGGREGATE_TYPE: ClassVar[str]
    AGGREGATE_ID_FIELD: ClassVar[str]
    """The field whose UUID is the envelope's AggregateId (the aggregate the Version counts)."""
    KEY_FIELD: ClassVar[str]
    """The field whose canonical UUID text is the Kafka record key, so the records of one key
    keep their order. By default the aggregate's id: one aggregate's versions in order."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "KEY_FIELD" not in vars(cls) and hasattr(cls, "AGGREGATE_ID_FIELD"):
            cls.KEY_FIELD = cls.AGGREGATE_ID_FIELD

    @property
    def aggregate_id(self) -> str:
        return str(getattr(self, self.AGGREGATE_ID_FIELD))

    @property
    def record_key(self) -> UUID:
        key: UUID = getattr(self, self.KEY_FIELD)
        return key

    @classmethod
    def key_wire_name(cls) -> str:
        """The wire (PascalCase) name of ``KEY_FIELD``: what the topic catalogue publishes."""
        return next(f.encode_name for f in msgspec.structs.fields(cls) if f.name == cls.KEY_FIELD)
