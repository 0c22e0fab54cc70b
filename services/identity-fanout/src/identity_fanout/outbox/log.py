"""The relay's logger: every part of the relay logs its events as `identity_fanout.outbox.relay`."""

from __future__ import annotations

import logging

__all__ = ["log"]

log = logging.getLogger("identity_fanout.outbox.relay")
