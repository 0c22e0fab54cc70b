"""Wire contracts of the PIN identity events: Structs, codec, Kafka record layout, topics.

JSON Schema tooling lives in ``pin_contracts.schemas`` (not imported here: it is a CLI).
"""

from pin_contracts import dlq
from pin_contracts.access import ActiveRoleAssignmentSnapshot, UserAccessChangedKafkaEvent
from pin_contracts.codec import decode, decode_access_changed, decode_membership_changed, encode
from pin_contracts.dlq import *  # noqa: F403 - the dead-letter header set is dlq.py's
from pin_contracts.enums import (
    AccessChangeReason,
    AgentMembershipStatus,
    FanOutTaskStatus,
    LeaveReason,
    ScopeType,
    UnknownEnumValue,
    parse_enum,
)
from pin_contracts.envelope import Envelope, EventPayload, envelope_for
from pin_contracts.errors import (
    ContractError,
    ContractViolation,
    InvalidEventError,
    UnknownEnumValueError,
)
from pin_contracts.event import EventStruct
from pin_contracts.kafka import (
    CONTRACT_VERSION_HEADER,
    EVENT_TYPE_HEADER,
    MESSAGE_ID_HEADER,
    TRACEPARENT_HEADER,
    TRACESTATE_HEADER,
    Headers,
    ReceivedHeaders,
    header_text,
    headers_for,
    kafka_key,
    trace_context,
    trace_headers,
)
from pin_contracts.membership import AgentMembershipChanged
from pin_contracts.topics import (
    AGENT_MEMBERSHIP_CHANGED,
    CATALOGUE,
    IDENTITY_MEMBERSHIP_DLQ,
    REWARDS_MEMBERSHIP_CONSUMER_GROUP,
    USER_ACCESS_CHANGED,
    Topic,
    key_partition,
)
from pin_contracts.untrusted import Unreadable, read_untrusted
from pin_contracts.wire import EMPTY_GUID, is_empty_guid

__all__ = [
    "AGENT_MEMBERSHIP_CHANGED",
    "CATALOGUE",
    "CONTRACT_VERSION_HEADER",
    "EMPTY_GUID",
    "EVENT_TYPE_HEADER",
    "IDENTITY_MEMBERSHIP_DLQ",
    "MESSAGE_ID_HEADER",
    "REWARDS_MEMBERSHIP_CONSUMER_GROUP",
    "TRACEPARENT_HEADER",
    "TRACESTATE_HEADER",
    "USER_ACCESS_CHANGED",
    "AccessChangeReason",
    "ActiveRoleAssignmentSnapshot",
    "AgentMembershipChanged",
    "AgentMembershipStatus",
    "ContractError",
    "ContractViolation",
    "Envelope",
    "EventPayload",
    "EventStruct",
    "FanOutTaskStatus",
    "Headers",
    "InvalidEventError",
    "LeaveReason",
    "ReceivedHeaders",
    "ScopeType",
    "Topic",
    "UnknownEnumValue",
    "UnknownEnumValueError",
    "Unreadable",
    "UserAccessChangedKafkaEvent",
    "decode",
    "decode_access_changed",
    "decode_membership_changed",
    "encode",
    "envelope_for",
    "header_text",
    "headers_for",
    "is_empty_guid",
    "kafka_key",
    "key_partition",
    "parse_enum",
    "read_untrusted",
    "trace_context",
    "trace_headers",
]
__all__ += dlq.__all__
