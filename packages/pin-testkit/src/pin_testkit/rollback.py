"""A rollback to the previous release and forward again, on a database this release migrated.

A rollback of the code runs the previous release's `migrate` on the newer schema: the chart's
pre-upgrade hook of a `helm upgrade` back to the previous chart, an old pod's migration Job
during a rollout. The pods of this release may still be running meanwhile, and must keep
every privilege their statements need; this release's `migrate`, run again, must succeed and
leave exactly what it declares. And from this release on, `migrate` refuses a schema that a
newer release migrated, changing nothing.

`RollbackChecks` is the same set of checks for every service: a service's test module
subclasses it as `TestRollback`, naming its `SERVICE`, `SCHEMA` and `ROLES` and giving the
`migrated` fixture (a database this release migrated, as its owner). The previous release is
built from git history (`releases.build_previous_release`), once per class. The privileges
checked are those `ROLES` declare (`runtime_roles.privilege_mismatches`), on every table and
sequence of the schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql

from pin_runtime.composition import REFUSED_EXIT_CODE
from pin_runtime.db_roles import RuntimeRole
from pin_testkit.releases import ServiceRelease, build_previous_release
from pin_testkit.runtime_roles import privilege_mismatches, schema_relations
from pin_testkit.service import CommandResult, run_command, script, service_environment

__all__ = ["NEWER_MIGRATION", "RollbackChecks", "grant_state"]

NEWER_MIGRATION = (9999, "9999_from_a_newer_release")
"""The row a newer release would have left in the migrations table."""

Conn = psycopg.Connection[Any]


def grant_state(conn: Conn, schema: str, groups: Sequence[str]) -> list[tuple[str, ...]]:
    """Everything a `migrate` may change about who may do what in ``schema``: the schema's,
    its relations' and their columns' ACLs, the database's, and the roles ``groups`` are
    members of."""
    return [
        tuple(str(value) for value in row)
        for row in conn.execute(
            """
            SELECT 'schema', nspname, coalesce(nspacl::text, '') FROM pg_namespace
             WHERE nspname = %(schema)s
            UNION ALL
            SELECT 'relation', relname, coalesce(relacl::text, '') FROM pg_class
             WHERE relnamespace = %(schema)s::regnamespace
            UNION ALL
            SELECT 'column', attrelid::regclass::text || '.' || attname, attacl::text
              FROM pg_attribute
             WHERE attacl IS NOT NULL
               AND attrelid IN (SELECT oid FROM pg_class
                                 WHERE relnamespace = %(schema)s::regnamespace)
            UNION ALL
            SELECT 'database', datname, coalesce(datacl::text, '') FROM pg_database
             WHERE datname = current_database()
            UNION ALL
            SELECT 'member', roleid::regrole::text, member::regrole::text FROM pg_auth_members
             WHERE member::regrole::text = ANY(%(groups)s)
            ORDER BY 1, 2, 3
            """,
            {"schema": schema, "groups": list(groups)},
        )
    ]


def _expect(condition: bool, message: str) -> None:
    # This module is not rewritten by pytest: each failure says what it found itself.
    if not condition:
        raise AssertionError(message)


class RollbackChecks:
    """The previous release's `migrate` on this release's schema takes nothing this
    release's processes need; this release's `migrate` then succeeds and grants exactly its
    declaration; and it refuses a schema newer than it knows (exit 2, one line, nothing
    changed)."""

    SERVICE: ClassVar[ServiceRelease]
    SCHEMA: ClassVar[str]
    ROLES: ClassVar[Sequence[RuntimeRole]]

    @pytest.fixture
    def migrated(self) -> str:
        """A database this release migrated (its owner's DSN): each service's fixture."""
        pytest.fail(f"{type(self).__name__} must override the `migrated` fixture")

    @pytest.fixture(scope="class")
    @classmethod
    def previous_program(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The previous release's console script, built from git history."""
        _, program = build_previous_release(
            cls.SERVICE, tmp_path_factory.mktemp(f"{cls.SERVICE.name}-previous")
        )
        return program

    def _migrate(self, program: str, dsn: str) -> CommandResult:
        prefix = self.SERVICE.package.upper() + "_"
        env = service_environment((prefix,), **{f"{prefix}DATABASE_DSN": dsn})
        return run_command(
            self.SERVICE.name, [script(program)], ["migrate"], env=env, timeout=120, check=False
        )

    def _mismatches(self, dsn: str, *, missing_only: bool) -> list[str]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return privilege_mismatches(
                conn,
                schema=self.SCHEMA,
                tables=schema_relations(conn, self.SCHEMA),
                roles=self.ROLES,
                missing_only=missing_only,
            )

    def test_the_previous_release_migrate_takes_nothing_this_release_needs(
        self, migrated: str, previous_program: Path
    ) -> None:
        rolled_back = self._migrate(str(previous_program), migrated)
        _expect(rolled_back.returncode == 0, f"the previous migrate: {rolled_back.stderr}")
        # What this release's pods, still running, need: declared and held, every one.
        lost = self._mismatches(migrated, missing_only=True)
        _expect(not lost, f"taken by the previous release's migrate: {lost}")

        rolled_forward = self._migrate(self.SERVICE.name, migrated)
        _expect(rolled_forward.returncode == 0, f"migrate again: {rolled_forward.stderr}")
        wrong = self._mismatches(migrated, missing_only=False)
        _expect(not wrong, f"after migrating forward again: {wrong}")

    def test_migrate_refuses_a_schema_newer_than_it_knows(self, migrated: str) -> None:
        version, name = NEWER_MIGRATION
        groups = [role.name for role in self.ROLES]
        with psycopg.connect(migrated, autocommit=True) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {} (version, name, checksum) VALUES (%s, %s, %s)").format(
                    sql.Identifier(self.SCHEMA, "schema_migrations")
                ),
                (version, name, "0" * 64),
            )
            # A privilege no release declares: a migrate that went ahead would revoke it.
            conn.execute(
                sql.SQL("GRANT SELECT ON {} TO {}").format(
                    sql.Identifier(self.SCHEMA, "schema_migrations"),
                    sql.Identifier(self.ROLES[0].name),
                )
            )
            before = grant_state(conn, self.SCHEMA, groups)

        refused = self._migrate(self.SERVICE.name, migrated)

        _expect(
            refused.returncode == REFUSED_EXIT_CODE,
            f"exit {refused.returncode}, not {REFUSED_EXIT_CODE}: {refused.stderr}",
        )
        *logged, line = refused.stderr.strip().splitlines()
        _expect(all(entry.startswith("{") for entry in logged), f"not one line: {logged}")
        _expect(line.startswith("error: ") and name in line, f"the refusal's line: {line}")
        with psycopg.connect(migrated, autocommit=True) as conn:
            after = grant_state(conn, self.SCHEMA, groups)
        changed = sorted(set(before) ^ set(after))
        _expect(not changed, f"changed by the refused migrate: {changed}")
