"""Agent memberships in agencies, and the AgentMembershipChanged events that announce them.

The membership producer, a second aggregate of identity next to the access fan-out; it
shares only the outbox (and with it the relay). Its parts:

- `decisions`: the producer rules, pure (`parse_request`, `next_membership`,
  `membership_event`, `membership_message`);
- `record`: the transaction (`record_membership_change`, `join_agency`, `leave_agency`,
  re-exported here: the producer's API) running the statements of `membership.sql`;
- `errors`: its refusals;
- `command`: `identity-fanout memberships join|leave`.
"""

from __future__ import annotations

from identity_fanout.membership.decisions import Membership, RecordedMembershipChange
from identity_fanout.membership.record import join_agency, leave_agency, record_membership_change

__all__ = [
    "Membership",
    "RecordedMembershipChange",
    "join_agency",
    "leave_agency",
    "record_membership_change",
]
