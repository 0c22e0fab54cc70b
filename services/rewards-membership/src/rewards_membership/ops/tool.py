"""What every operator command shares: its database connection (`rewards-membership-cli` in
`pg_stat_activity`, bounded by the service's session limits) and the one JSON document per
line that `--json` prints on stdout."""

from __future__ import annotations

import sys

import msgspec
import psycopg
from psycopg.rows import TupleRow

from pin_runtime.postgres import connect
from rewards_membership.settings import SERVICE_NAME, Settings

__all__ = ["connect_tool", "write_json"]


def connect_tool(settings: Settings) -> psycopg.Connection[TupleRow]:
    return connect(
        settings.database_dsn.reveal(),
        settings.database_session(),
        application_name=f"{SERVICE_NAME}-cli",
    )


def write_json(document: object) -> None:
    sys.stdout.write(msgspec.json.encode(document).decode() + "\n")
