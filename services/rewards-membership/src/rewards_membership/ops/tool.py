"""What every operator command shares: its database connection (`rewards-membership-cli` in
`pg_stat_activity`, bounded by the service's session limits), the one JSON document per
line that `--json` prints on stdout, the one symbol a table shows for a missing value, and
the one line saying which dependency could not be reached (`say_unavailable`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Final

import msgspec
import psycopg
from psycopg.rows import TupleRow

from pin_runtime.composition import ERROR_EXIT_CODE, error_line
from pin_runtime.postgres import auth_failure, connect
from rewards_membership.settings import SERVICE_NAME, Settings

__all__ = [
    "MISSING",
    "cell",
    "connect_tool",
    "database_unavailable",
    "say_unavailable",
    "write_json",
]

MISSING: Final = "-"
"""What a table shows for a value there is none of (JSON says null), as identity-fanout's."""

# How the one line names each dependency (`--json`'s `unavailable` keys are the left side,
# the names a paused partition's note gives them).
_NAMED: Final = {"postgresql": "database", "kafka": "kafka"}


def cell(value: object) -> str:
    """A table cell: the value's text, `MISSING` for None or an empty text."""
    text = "" if value is None else str(value)
    return text or MISSING


def connect_tool(settings: Settings) -> psycopg.Connection[TupleRow]:
    return connect(
        settings.database_dsn.reveal(),
        settings.database_session(),
        application_name=f"{SERVICE_NAME}-cli",
    )


def write_json(document: object) -> None:
    sys.stdout.write(msgspec.json.encode(document).decode() + "\n")


def database_unavailable(exc: psycopg.OperationalError) -> str | None:
    """Why the database cannot answer, in one line, for a command that goes on with what
    Kafka can answer; None when it refused the login (the caller raises it again: a bad
    setting, exit 2 naming the variable under `run_command`, not an outage)."""
    if auth_failure(exc) is not None:
        return None
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def say_unavailable(unavailable: Mapping[str, str]) -> int:
    """The command's exit code after what it showed: 0, or 1 with ONE line on stderr saying
    what it could not reach (`error: kafka unavailable: ...; database unavailable: ...`)."""
    if not unavailable:
        return 0
    error_line(
        "error: "
        + "; ".join(
            f"{_NAMED.get(name, name)} unavailable: {why}" for name, why in unavailable.items()
        )
    )
    return ERROR_EXIT_CODE
