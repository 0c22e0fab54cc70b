"""Named SQL statements kept in `.sql` files inside a package, loaded once at import.

A file holds statements under headers; the comment lines right after a header are the
statement's doc, the text up to the next header is the statement:

    -- name: claim_task --
    -- The oldest Pending task, SKIP LOCKED.
    UPDATE identity.access_fanout_tasks ... RETURNING ...

Statements keep psycopg's named parameters (`%(id)s`, a literal `%` written `%%`) and may
carry `{name}` slots for identifiers and fragments composed with `psycopg.sql`
(`Queries.compose`); nothing is ever formatted from data. A malformed file (a duplicate or
empty name, a statement without text, text before the first header) raises `SqlFileError`
when the module loading it is imported, not when the statement first runs.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Collection, Iterator, Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any, LiteralString

import msgspec
from psycopg import sql

from pin_runtime.errors import PinRuntimeError, TemplatedError

__all__ = ["Queries", "SqlFileError", "assignments", "columns", "load_queries", "parse_queries"]

_HEADER = re.compile(r"^--\s*name:(?P<name>.*?)--\s*$")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# Attribute access must reach the statement, never a method of the mapping.
_RESERVED = frozenset({"compose", "doc", "get", "items", "keys", "source", "values"})


class SqlFileError(PinRuntimeError, TemplatedError):
    """A `.sql` file of named statements is malformed; `source:line` says where."""

    template = "{source}:{line}: {problem}"
    source: str
    line: int
    problem: str


@dataclasses.dataclass(slots=True)
class _Draft:
    name: str
    line: int
    doc: list[str] = dataclasses.field(default_factory=list)
    body: list[str] = dataclasses.field(default_factory=list)


class Queries(Mapping[str, LiteralString]):
    """The statements of one file, by name (`queries["x"]` or `queries.x`); immutable."""

    __slots__ = ("_docs", "_source", "_statements")
    _statements: Mapping[str, LiteralString]
    _docs: Mapping[str, str]
    _source: str

    def __init__(self, source: str, statements: Mapping[str, str], docs: Mapping[str, str]):
        # The text comes from a file shipped inside the package, never from data: it is as
        # trustworthy as a literal in the code, which is what LiteralString stands for.
        object.__setattr__(self, "_statements", MappingProxyType(dict(statements)))
        object.__setattr__(self, "_docs", MappingProxyType(dict(docs)))
        object.__setattr__(self, "_source", source)

    @property
    def source(self) -> str:
        return self._source

    def __getitem__(self, name: str) -> LiteralString:
        try:
            return self._statements[name]
        except KeyError:
            raise KeyError(f"{self._source} has no statement {name!r}") from None

    def __getattr__(self, name: str) -> LiteralString:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._statements[name]
        except KeyError:
            raise AttributeError(f"{self._source} has no statement {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._statements)

    def __len__(self) -> int:
        return len(self._statements)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __repr__(self) -> str:
        return f"Queries({self._source!r}, {sorted(self._statements)})"

    def doc(self, name: str) -> str:
        """The comment under the statement's header ('' when it has none)."""
        self.__getitem__(name)  # the KeyError of an unknown statement
        return self._docs.get(name, "")

    def compose(self, name: str, **parts: sql.Composable) -> LiteralString:
        """The statement with its `{slot}`s filled by `psycopg.sql` parts, as plain text.

        Identifiers are quoted by psycopg, fragments inserted as SQL; the result is composed
        once (at import) and executed like any other statement.
        """
        composed = sql.SQL(self[name]).format(**parts)
        return composed.as_string(None)


def _header(line: str, number: int, source: str, drafts: list[_Draft]) -> _Draft | None:
    """The statement a `-- name: x --` line opens (None for any other line)."""
    header = _HEADER.match(line.strip())
    if header is None:
        return None
    name = header["name"].strip()
    if not name:
        raise SqlFileError(source, number, "statement header without a name")
    if not _NAME.match(name):
        raise SqlFileError(source, number, f"statement name {name!r} is not snake_case")
    if name in _RESERVED:
        raise SqlFileError(source, number, f"statement name {name!r} is reserved")
    for earlier in drafts:
        if earlier.name == name:
            raise SqlFileError(
                source, number, f"duplicate statement {name!r} (first at line {earlier.line})"
            )
    return _Draft(name=name, line=number)


def parse_queries(text: str, source: str = "<sql>") -> Queries:
    """Split `text` into named statements; SqlFileError on anything malformed."""
    drafts: list[_Draft] = []
    for number, line in enumerate(text.splitlines(), start=1):
        opened = _header(line, number, source, drafts)
        if opened is not None:
            drafts.append(opened)
            continue
        stripped = line.strip()
        if not drafts:
            if stripped and not stripped.startswith("--"):
                raise SqlFileError(source, number, "SQL before the first '-- name: ... --' header")
            continue
        draft = drafts[-1]
        if not draft.body and stripped.startswith("--"):
            draft.doc.append(stripped.removeprefix("--").strip())
        elif draft.body or stripped:
            draft.body.append(line.rstrip())
    statements: dict[str, str] = {}
    for draft in drafts:
        body = "\n".join(draft.body).strip()
        if not body:
            raise SqlFileError(source, draft.line, f"statement {draft.name!r} is empty")
        statements[draft.name] = body
    return Queries(source, statements, {d.name: " ".join(d.doc) for d in drafts if d.doc})


@functools.cache
def load_queries(package: str, filename: str) -> Queries:
    """The statements of `filename` (a path with `/` inside `package`), read through
    `importlib.resources`: it works from a wheel, a zip or a source tree alike."""
    resource = resources.files(package).joinpath(*filename.split("/"))
    return parse_queries(resource.read_text(encoding="utf-8"), f"{package}/{filename}")


def _field_names(row_type: type[Any]) -> tuple[str, ...]:
    if issubclass(row_type, msgspec.Struct):
        return row_type.__struct_fields__
    if dataclasses.is_dataclass(row_type):
        return tuple(field.name for field in dataclasses.fields(row_type))
    raise TypeError(f"{row_type!r} is neither a msgspec Struct nor a dataclass")


def columns(row_type: type[Any], *, prefix: str | None = None) -> sql.Composed:
    """The column list of a row type (a msgspec Struct or a dataclass), in field order.

    The row type's fields are the one place a column list is written: the statements say
    `SELECT {columns}` and read rows with `psycopg.rows.class_row(row_type)`.
    """
    return sql.SQL(", ").join(
        sql.Identifier(name) if prefix is None else sql.Identifier(prefix, name)
        for name in _field_names(row_type)
    )


def assignments(row_type: type[Any], source: str, *, keep: Collection[str] = ()) -> sql.Composed:
    """`col = source.col, ...` for the row type's fields but `keep` (the key columns): the
    SET list of an UPDATE (`source` the row document's alias) or of an upsert (`excluded`),
    from the same one place as `columns`."""
    unknown = set(keep).difference(_field_names(row_type))
    if unknown:
        raise ValueError(f"{row_type.__name__} has no field(s) {sorted(unknown)}")
    return sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(name), sql.Identifier(source, name))
        for name in _field_names(row_type)
        if name not in keep
    )
