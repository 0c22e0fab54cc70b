"""pin_testkit.releases: what an expand migration may not do, the notes' lists."""

from __future__ import annotations

import pytest

from pin_contracts.release import Version
from pin_testkit.releases import (
    Release,
    changelog_versions,
    contract_migrations,
    contract_statements,
    recorded_releases,
)

EXPAND = """
-- the operator's comment says DROP TABLE and RENAME: no statement
CREATE TABLE s.audit (id bigint PRIMARY KEY, note text NOT NULL);
ALTER TABLE s.outbox ADD COLUMN key_slot smallint NOT NULL DEFAULT 0,
    ADD COLUMN label text, ADD CONSTRAINT outbox_label_check CHECK (label <> 'DROP');
ALTER TABLE s.inbox DROP CONSTRAINT inbox_outcome_check;
ALTER TABLE s.inbox ALTER COLUMN reason DROP NOT NULL;
ALTER TABLE s.tasks ADD COLUMN n integer NOT NULL GENERATED ALWAYS AS (1) STORED;
CREATE INDEX ix_outbox_key_slot_id ON s.outbox (key_slot, id);
CREATE FUNCTION s.slot(text) RETURNS int LANGUAGE sql AS $$ SELECT 1; -- DROP $$;
"""


def test_an_expand_migration_passes() -> None:
    assert contract_statements(EXPAND) == []


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("DROP TABLE s.old;", "drops something"),
        ("ALTER TABLE s.t DROP COLUMN c;", "drops something"),
        ("ALTER TABLE s.t ALTER COLUMN c DROP DEFAULT;", "drops something"),
        ("DROP INDEX s.ix;", "drops something"),
        ("ALTER TABLE s.t RENAME COLUMN a TO b;", "renames something"),
        ("ALTER TABLE s.t RENAME TO u;", "renames something"),
        ("ALTER TABLE s.t ALTER COLUMN c TYPE bigint;", "changes a column's type"),
        ("ALTER TABLE s.t ALTER c SET DATA TYPE bigint;", "changes a column's type"),
        ("ALTER TABLE s.t ALTER COLUMN c SET NOT NULL;", "makes a column NOT NULL"),
        ("ALTER TABLE s.t ADD COLUMN c uuid NOT NULL;", "adds a NOT NULL column without a DEFAULT"),
        (
            "ALTER TABLE s.t ADD COLUMN a text, ADD COLUMN b numeric(10, 2) NOT NULL;",
            "adds a NOT NULL column without a DEFAULT",
        ),
        ("TRUNCATE s.t;", "empties a table"),
    ],
)
def test_a_contracting_statement_is_named(sql: str, reason: str) -> None:
    (found,) = contract_statements(EXPAND + sql)
    assert found.startswith(f"{reason}: ")
    assert found.endswith(sql.rstrip(";"))


def test_the_contract_migrations_are_those_the_section_names() -> None:
    notes = (
        "# Upgrading\n\nMentions `0003_x.sql` elsewhere.\n\n## Contract migrations\n\n"
        "- `0012_drop_label.sql` (0.4.0): drops outbox.label, unused since 0.3.0.\n"
        "- `0013_rename-x.sql` (0.4.0)\n\n## Versioning\n\n`0014_y.sql`\n"
    )
    assert contract_migrations(notes) == {"0012_drop_label.sql", "0013_rename-x.sql"}
    assert contract_migrations("# Upgrading\n") == set()


def test_changelog_versions() -> None:
    text = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-05\n\n## 0.1.0\n"
    assert changelog_versions(text) == [Version(0, 2, 0), Version(0, 1, 0)]


def test_the_recorded_releases_are_the_rows_with_a_tag_and_a_full_commit() -> None:
    old, new = "a" * 40, "b" * 40
    notes = (
        "| version | tag | commit | newest migration |\n|---|---|---|---|\n"
        "| 0.3.0 | not yet tagged | | `0012_x.sql` |\n"
        f"| 0.1.0 | `svc-v0.1.0` | `{old}` (2026-11-30) | `0004_y.sql` |\n"
        f"| 0.2.0 | `svc-v0.2.0` | `{new}` (2026-12-05) | `0011_z.sql` |\n"
        "| 0.0.9 | `svc-v0.0.9` | `abc1234` | a short id is no record |\n"
    )
    assert recorded_releases(notes) == [
        Release(Version(0, 2, 0), "svc-v0.2.0", new),
        Release(Version(0, 1, 0), "svc-v0.1.0", old),
    ]
