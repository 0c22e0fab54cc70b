from __future__ import annotations

import hashlib
from importlib.resources import files
from pathlib import Path

import pytest

from pin_runtime.errors import MigrationError
from pin_runtime.migrations import advisory_lock_key, load_migrations, migrate


def write(directory: Path, files_: dict[str, str]) -> Path:
    directory.mkdir(exist_ok=True)
    for name, text in files_.items():
        (directory / name).write_text(text)
    return directory


def test_orders_by_number_with_gaps(tmp_path: Path) -> None:
    directory = write(
        tmp_path / "m",
        {
            "0010_add_index.sql": "CREATE INDEX i ON t (a);",
            "0002_create.sql": "CREATE TABLE t (a int);",
            "1_first.sql": "SELECT 1;",
            "__init__.py": "",
            "README.md": "not a migration",
        },
    )
    (directory / "sub.sql").mkdir()  # a directory is not a file
    plan = load_migrations(directory)
    assert [(m.version, m.name) for m in plan] == [
        (1, "1_first"),
        (2, "0002_create"),
        (10, "0010_add_index"),
    ]
    assert plan[1].checksum == hashlib.sha256(b"CREATE TABLE t (a int);").hexdigest()
    assert plan[1].sql == b"CREATE TABLE t (a int);"


def test_duplicate_versions_rejected(tmp_path: Path) -> None:
    directory = write(tmp_path / "m", {"0001_a.sql": "", "001_b.sql": ""})
    with pytest.raises(MigrationError, match="duplicate migration version 1"):
        load_migrations(directory)


@pytest.mark.parametrize("name", ["create.sql", "0001-create.sql", "0001_.sql", "v1_x.sql"])
def test_misnamed_sql_file_rejected(tmp_path: Path, name: str) -> None:
    directory = write(tmp_path / "m", {name: ""})
    with pytest.raises(MigrationError, match=r"expected NNNN_description\.sql"):
        load_migrations(directory)


def test_empty_directory(tmp_path: Path) -> None:
    assert load_migrations(write(tmp_path / "m", {})) == []


def test_loads_from_package_resources() -> None:
    # Traversable from importlib.resources, the way services ship their files.
    plan = load_migrations(files("pin_runtime"))
    assert plan == []


def test_lock_key_is_stable_and_per_schema() -> None:
    # Pinned: a change would let an old and a new runner migrate the same schema at once.
    assert advisory_lock_key("identity") == advisory_lock_key("identity")
    assert advisory_lock_key("identity") != advisory_lock_key("rewards")
    assert -(2**63) <= advisory_lock_key("identity") < 2**63
    assert advisory_lock_key("identity") == int.from_bytes(
        hashlib.sha256(b"pin-migrations:identity").digest()[:8], "big", signed=True
    )


@pytest.mark.parametrize("schema", ["Identity", "1abc", "a-b", 'x"; DROP', ""])
def test_schema_name_validated_before_connecting(tmp_path: Path, schema: str) -> None:
    with pytest.raises(ValueError, match="schema"):
        migrate("postgresql://nowhere.invalid/x", schema=schema, migrations=tmp_path)


def test_bad_file_set_fails_before_connecting(tmp_path: Path) -> None:
    directory = write(tmp_path / "m", {"oops.sql": ""})
    with pytest.raises(MigrationError):
        migrate("postgresql://nowhere.invalid/x", schema="identity", migrations=directory)
