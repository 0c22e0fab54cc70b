"""A relay's pause as the other sessions see it: in its lanes' session's application_name.

`identity-fanout status` and `outbox status` read the database, never the relays, and learn
of the relays from their sessions (the member and slot advisory locks, with
pg_stat_activity's application_name beside them). A paused relay appends its pause's reason
(and the topic, when it fits) to that name, `identity-fanout-relay@host paused:unknown-topic
pin.identity.access.v1`, when the pause starts or changes, and takes it off when it ends:
one statement per change of the pause, never one per round, nothing to clean up after a
crash (the session and its name end together), and the same name again after a reconnect.

The server keeps 63 bytes of a name: the reason always fits (the base name is cut for it);
the topic is left out when it does not fit whole. Pure: `session_name` writes the name,
`pause_of` reads it back, whatever reason the pause mechanism carries.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

__all__ = ["NAME_LIMIT", "PauseMark", "base_name", "pause_of", "session_name"]

NAME_LIMIT: Final = 63
"""Bytes of application_name the server keeps (NAMEDATALEN - 1)."""
_MARK: Final = " paused:"
_READ: Final = re.compile(r" paused:(?P<reason>[A-Za-z0-9_.-]+)(?: (?P<topic>\S+))?$")


class PauseMark(msgspec.Struct, frozen=True, kw_only=True):
    """A relay instance's pause, as its session's name carries it."""

    reason: str
    """The pause's reason as the relay names it (`relay paused` log line, the
    identity_outbox_relay_paused gauge's label): unknown-topic, topic-authorization, ..."""
    topic: str | None = None
    """The topic it showed on; None when it did not fit in the name."""


def session_name(base: str, reason: str | None, topic: str | None = None) -> str:
    """`base`, or `base paused:<reason> <topic>` within `NAME_LIMIT` (ASCII names)."""
    if reason is None:
        return base[:NAME_LIMIT]
    mark = f"{_MARK}{reason}"
    if topic and len(base) + len(mark) + 1 + len(topic) <= NAME_LIMIT:
        mark = f"{mark} {topic}"
    return base[: max(0, NAME_LIMIT - len(mark))] + mark


def pause_of(application_name: str | None) -> PauseMark | None:
    """The pause a session's name carries (None: not paused, or no relay's name)."""
    found = _READ.search(application_name or "")
    if found is None:
        return None
    return PauseMark(reason=found["reason"], topic=found["topic"])


def base_name(application_name: str | None) -> str | None:
    """The name without its pause mark."""
    if application_name is None:
        return None
    found = _READ.search(application_name)
    return application_name if found is None else application_name[: found.start()]
