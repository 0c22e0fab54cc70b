from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import datetime
from uuid import UUID

import msgspec
import pytest
from psycopg import sql

from pin_runtime.sql import (
    Queries,
    SqlFileError,
    assignments,
    columns,
    load_queries,
    parse_queries,
)

ImportablePackage = Callable[[str, Mapping[str, str]], None]  # the conftest fixture

FILE = """\
-- Statements of the example aggregate.

-- name: claim_task --
-- The oldest Pending task.
UPDATE t SET status = 'InProgress'
 WHERE id = %(id)s -- a comment inside stays
RETURNING id

-- name: count_ready --
SELECT count(*) FROM t WHERE status = 'Pending' AND n %% 2 = 0
"""


def test_statements_by_name_and_attribute() -> None:
    queries = parse_queries(FILE, "example.sql")
    assert list(queries) == ["claim_task", "count_ready"]
    assert queries.claim_task == queries["claim_task"]
    assert queries.claim_task == (
        "UPDATE t SET status = 'InProgress'\n"
        " WHERE id = %(id)s -- a comment inside stays\n"
        "RETURNING id"
    )
    assert queries.count_ready.endswith("n %% 2 = 0")


def test_the_comment_under_a_header_is_the_doc_not_the_statement() -> None:
    queries = parse_queries(FILE)
    assert queries.doc("claim_task") == "The oldest Pending task."
    assert queries.doc("count_ready") == ""
    assert "oldest" not in queries.claim_task


def test_unknown_statement_names_the_file() -> None:
    queries = parse_queries(FILE, "example.sql")
    with pytest.raises(AttributeError, match=r"example\.sql has no statement 'nope'"):
        _ = queries.nope
    with pytest.raises(KeyError, match="nope"):
        _ = queries["nope"]
    with pytest.raises(KeyError, match="nope"):
        queries.doc("nope")


def test_queries_are_read_only() -> None:
    queries = parse_queries(FILE)
    with pytest.raises(AttributeError, match="read-only"):
        queries.claim_task = "DELETE FROM t"
    assert isinstance(queries, Queries)


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("-- name: a --\nSELECT 1\n-- name: a --\nSELECT 2\n", 3, "duplicate statement 'a'"),
        ("-- name:  --\nSELECT 1\n", 1, "header without a name"),
        ("-- name: a --\n-- only a doc\n\n-- name: b --\nSELECT 1\n", 1, "'a' is empty"),
        ("-- name: b --\nSELECT 1\n-- name: a --\n", 3, "'a' is empty"),
        ("SELECT 1\n-- name: a --\nSELECT 2\n", 1, "before the first"),
        ("-- name: Bad-Name --\nSELECT 1\n", 1, "not snake_case"),
        ("-- name: keys --\nSELECT 1\n", 1, "'keys' is reserved"),
    ],
)
def test_malformed_files_fail_loudly(text: str, line: int, problem: str) -> None:
    with pytest.raises(SqlFileError, match=problem) as raised:
        parse_queries(text, "bad.sql")
    assert raised.value.source == "bad.sql"
    assert raised.value.line == line
    assert str(raised.value).startswith(f"bad.sql:{line}: ")


def test_compose_fills_identifier_and_fragment_slots() -> None:
    queries = parse_queries(
        "-- name: release --\nUPDATE {unit} SET n = n - 1 WHERE id = %(id)s {extra}\n"
    )
    text = queries.compose(
        "release",
        unit=sql.Identifier("identity", "access_fanout_tasks"),
        extra=sql.SQL("AND status = 'InProgress'"),
    )
    assert text == (
        'UPDATE "identity"."access_fanout_tasks" SET n = n - 1 WHERE id = %(id)s '
        "AND status = 'InProgress'"
    )


class Row(msgspec.Struct, frozen=True):
    id: UUID
    created_at: datetime


@dataclasses.dataclass
class Pair:
    key: str
    value: int


def test_columns_of_a_row_type() -> None:
    assert columns(Row).as_string(None) == '"id", "created_at"'
    assert columns(Row, prefix="t").as_string(None) == '"t"."id", "t"."created_at"'
    assert columns(Pair).as_string(None) == '"key", "value"'
    with pytest.raises(TypeError, match="neither"):
        columns(dict)


def test_assignments_of_a_row_type_but_its_key() -> None:
    assert assignments(Pair, "u", keep=("key",)).as_string(None) == '"value" = "u"."value"'
    assert assignments(Row, "excluded").as_string(None) == (
        '"id" = "excluded"."id", "created_at" = "excluded"."created_at"'
    )
    with pytest.raises(ValueError, match="no field"):
        assignments(Pair, "u", keep=("id",))


def test_load_queries_reads_a_file_of_a_package_once(
    importable_package: ImportablePackage,
) -> None:
    broken = "-- name: a --\nSELECT 1\n-- name: a --\nX\n"
    importable_package("sqlkit_example", {"sql/tasks.sql": FILE, "sql/broken.sql": broken})
    queries = load_queries("sqlkit_example", "sql/tasks.sql")
    assert queries.source == "sqlkit_example/sql/tasks.sql"
    assert queries.count_ready.startswith("SELECT count(*)")
    assert load_queries("sqlkit_example", "sql/tasks.sql") is queries
    with pytest.raises(SqlFileError, match=r"sqlkit_example/sql/broken\.sql:3: duplicate"):
        load_queries("sqlkit_example", "sql/broken.sql")
