"""`rewards-membership inbox prune`: the idempotency marks older than a cut-off deleted
(dead-letter marks stay), or with `--dry-run` counted inside a transaction rolled back; the
audit line `inbox pruned` for every prune that is not a dry run."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime, timedelta

import msgspec

from pin_runtime.logging import log_event
from rewards_membership.ops.tool import connect_tool, write_json
from rewards_membership.settings import Settings
from rewards_membership.store import prune_inbox

__all__ = ["PruneResult", "inbox_prune"]

# The audit line on the service's logger, as every command's.
_log = logging.getLogger(__name__)


class PruneResult(msgspec.Struct, frozen=True, kw_only=True):
    """What `inbox prune --json` prints."""

    deleted: int
    """The marks deleted; in a dry run, the marks the prune would delete."""
    before: datetime
    """The cut-off: marks processed before it go (dead-letter marks stay)."""
    dry_run: bool


def inbox_prune(
    settings: Settings, older_than: timedelta, *, dry_run: bool = False, as_json: bool = False
) -> int:
    now = datetime.now(UTC)
    with connect_tool(settings) as conn:
        deleted = prune_inbox(conn, older_than, now=now, dry_run=dry_run)
    if as_json:
        write_json(PruneResult(deleted=deleted, before=now - older_than, dry_run=dry_run))
    elif dry_run:
        sys.stdout.write(f"{deleted} mark(s) would be deleted (dry run: nothing deleted)\n")
    if not dry_run:
        log_event(_log, "inbox pruned", deleted=deleted, olderThan=str(older_than))
    return 0
