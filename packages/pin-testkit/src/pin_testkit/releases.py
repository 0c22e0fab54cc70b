"""A service's releases: its version, its tags, its notes, what its migrations may do, and the
previous release built from git history.

- A release of a service is a commit on main, recorded as a row of its UPGRADING.md "Releases"
  table (version, tag, full commit id) and marked by a lightweight tag
  ``<service>-v<MAJOR.MINOR.PATCH>``. The table is what the checks read: a clone of main
  alone carries the commits but not the tags, and the table cannot move once committed. The
  version being worked on is the one in the service's ``pyproject.toml``; the previous
  release is the table's newest row below it (``previous_release``). Where the tag is
  present it must name the row's commit.
- Migrations are expand/contract: a migration added since the previous release must leave
  that release able to run against the new schema (``contract_statements`` names what would
  not), unless UPGRADING.md lists it under "Contract migrations" (``contract_migrations``),
  released only once no older version runs.
- ``build_release``: the previous release's package, from ``git archive`` of its commit, into a
  virtual environment of its own with the dependencies its own lockfile pins (uv's cache
  serves them, offline once they were fetched), for the rolling-upgrade scenario.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final

from pin_contracts.release import Version

__all__ = [
    "Release",
    "ReleaseRuleChecks",
    "ServiceRelease",
    "build_previous_release",
    "build_release",
    "changelog_versions",
    "contract_migrations",
    "contract_statements",
    "files_at",
    "is_ancestor",
    "previous_release",
    "recorded_releases",
    "release_tags",
    "uv_binary",
]

ROOT: Final = Path(__file__).resolve().parents[4]
"""The repository (this package is packages/pin-testkit/src/pin_testkit)."""

WORKSPACE_DEPENDENCIES: Final = ("contracts", "packages/pin-runtime")
"""The workspace members every service installs with it."""


@dataclass(frozen=True, slots=True)
class ServiceRelease:
    """One service as its ``pyproject.toml`` declares it."""

    name: str
    directory: Path
    version: Version

    @classmethod
    def of(cls, directory: Path) -> ServiceRelease:
        project = tomllib.loads((directory / "pyproject.toml").read_text(encoding="utf-8"))
        return cls(
            name=project["project"]["name"],
            directory=directory,
            version=Version.parse(project["project"]["version"]),
        )

    @property
    def package(self) -> str:
        """Its import package (``identity_fanout``)."""
        return self.name.replace("-", "_")

    @property
    def migrations(self) -> Path:
        return self.directory / "src" / self.package / "migrations"

    def tag(self, version: Version) -> str:
        return f"{self.name}-v{version}"


def _git(*args: str, repo: Path = ROOT) -> bytes:
    """What a git command prints (the repository's own history: tags, trees, archives)."""
    return subprocess.run(  # noqa: S603 - git on this repository, arguments built here
        ["git", "-C", str(repo), *args],  # noqa: S607 - git of the PATH, as make's
        check=True,
        capture_output=True,
    ).stdout


def release_tags(service: str, repo: Path = ROOT) -> dict[Version, str]:
    """Every ``<service>-v<version>`` tag, by version."""
    found: dict[Version, str] = {}
    for tag in _git("tag", "--list", f"{service}-v*", repo=repo).decode().split():
        try:
            found[Version.parse(tag.removeprefix(f"{service}-v"))] = tag
        except ValueError:
            continue  # not a release tag (e.g. a -rc suffix)
    return found


@dataclass(frozen=True, slots=True, order=True)
class Release:
    """One row of a service's UPGRADING.md "Releases" table."""

    version: Version
    tag: str
    commit: str


_RELEASE_ROW: Final = re.compile(
    r"^\|\s*(?P<version>\d+\.\d+\.\d+)\s*\|\s*`(?P<tag>[^`]+)`\s*\|\s*`(?P<commit>[0-9a-f]{40})`",
    re.M,
)


def recorded_releases(upgrading: str) -> list[Release]:
    """The released versions UPGRADING.md's table records (rows with a tag and a full commit
    id; the version being prepared has neither), newest first."""
    rows = [
        Release(Version.parse(m["version"]), m["tag"], m["commit"])
        for m in _RELEASE_ROW.finditer(upgrading)
    ]
    return sorted(rows, reverse=True)


def previous_release(release: ServiceRelease) -> Release | None:
    """The newest recorded release below the version being worked on, or None."""
    upgrading = (release.directory / "UPGRADING.md").read_text(encoding="utf-8")
    older = [r for r in recorded_releases(upgrading) if r.version < release.version]
    return older[0] if older else None


def is_ancestor(commit: str, revision: str = "HEAD", repo: Path = ROOT) -> bool:
    """Whether ``commit`` is in ``revision``'s history (False when this clone lacks it)."""
    done = subprocess.run(  # noqa: S603 - git on this repository, arguments built here
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", commit, revision],  # noqa: S607
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def files_at(revision: str, directory: Path, repo: Path = ROOT) -> dict[str, bytes]:
    """The files directly in ``directory`` at ``revision``, by name."""
    relative = directory.resolve().relative_to(repo.resolve()).as_posix()
    names = _git("ls-tree", "--name-only", f"{revision}:{relative}", repo=repo).decode().split()
    return {name: _git("show", f"{revision}:{relative}/{name}", repo=repo) for name in names}


_CHANGELOG_ENTRY: Final = re.compile(r"^## \[?(\d+\.\d+\.\d+)\]?", re.M)


def changelog_versions(changelog: str) -> list[Version]:
    """The versions a Keep a Changelog file has an entry for (``## [1.2.0] - date``)."""
    return [Version.parse(match) for match in _CHANGELOG_ENTRY.findall(changelog)]


_CONTRACT_SECTION: Final = re.compile(
    r"^## Contract migrations\n(?P<body>.*?)(?=^## |\Z)", re.M | re.S
)
_MIGRATION_NAME: Final = re.compile(r"`(\d{4}_[A-Za-z0-9_\-]+\.sql)`")


def contract_migrations(upgrading: str) -> set[str]:
    """The migration files UPGRADING.md's "Contract migrations" section names: the ones that
    may take from the schema what an older release still uses."""
    section = _CONTRACT_SECTION.search(upgrading)
    return set(_MIGRATION_NAME.findall(section["body"])) if section else set()


# -- what an expand migration may not do ------------------------------------------------------

# Left to right, whichever starts first: a comment (out), a string or a dollar-quoted body
# (emptied), so that neither an apostrophe in a comment nor a keyword in a body misleads.
_NOT_CODE: Final = re.compile(
    r"(?P<comment>--[^\n]*|/\*.*?\*/)|'(?:[^']|'')*'|(?P<tag>\$[A-Za-z_]*\$).*?(?P=tag)", re.S
)
_CONTRACTING: Final = (
    (re.compile(r"\bDROP\b(?!\s+(?:NOT\s+NULL|CONSTRAINT)\b)"), "drops something"),
    (re.compile(r"\bRENAME\b"), "renames something"),
    (
        re.compile(r"\bALTER\s+(?:COLUMN\s+)?(?:\"[^\"]+\"|\w+)\s+(?:SET\s+DATA\s+)?TYPE\b"),
        "changes a column's type",
    ),
    (re.compile(r"\bSET\s+NOT\s+NULL\b"), "makes a column NOT NULL"),
    (re.compile(r"\bTRUNCATE\b"), "empties a table"),
)
_ADD_COLUMN: Final = re.compile(
    r"^ADD\s+(?!CONSTRAINT\b|PRIMARY\b|UNIQUE\b|CHECK\b|FOREIGN\b|EXCLUDE\b)"
)


def _top_level_clauses(statement: str) -> list[str]:
    """An ALTER TABLE's clauses: split at the commas outside parentheses."""
    clauses: list[str] = []
    current: list[str] = []
    depth = 0
    for char in statement:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            clauses.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    clauses.append("".join(current).strip())
    return clauses


def contract_statements(sql: str) -> list[str]:
    """Why a migration is no expand migration: each statement that takes from the schema
    what an older release may still use (drops, renames, type changes, a column made NOT
    NULL, a NOT NULL column added without a DEFAULT the older release's INSERTs would need,
    a table emptied), as ``reason: statement``. Empty for an expand-only migration.

    Relaxations pass (``DROP NOT NULL``, ``DROP CONSTRAINT``: an older release's writes
    still fit); so do new tables, columns with a default or nullable, indexes, functions.
    A new constraint must accept every row an older release writes: no text rule can tell,
    UPGRADING.md asks the author.
    """
    text = _NOT_CODE.sub(lambda m: " " if m["comment"] else "''", sql)
    found: list[str] = []
    for raw in text.split(";"):
        statement = " ".join(raw.split())
        if not statement:
            continue
        upper = statement.upper()
        reasons = [reason for pattern, reason in _CONTRACTING if pattern.search(upper)]
        alter = re.match(r"ALTER\s+TABLE\s+(?:ONLY\s+|IF\s+EXISTS\s+)*\S+\s+(?P<body>.*)", upper)
        if alter:
            for clause in _top_level_clauses(alter["body"]):
                if (
                    _ADD_COLUMN.match(clause)
                    and re.search(r"\bNOT\s+NULL\b", clause)
                    and not re.search(r"\b(?:DEFAULT|GENERATED)\b", clause)
                ):
                    reasons.append("adds a NOT NULL column without a DEFAULT")
        found.extend(f"{reason}: {statement}" for reason in reasons)
    return found


# -- the previous release, built --------------------------------------------------------------


def uv_binary() -> str:
    """The uv that runs this session (``uv run`` exports it as UV), else the one on PATH,
    else the repository's own (``make sync``)."""
    for candidate in (os.environ.get("UV"), shutil.which("uv"), str(ROOT / ".tools/uv/bin/uv")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise FileNotFoundError("no uv: run `make sync`, or put uv on PATH")


def _uv(*args: str, cwd: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    result = subprocess.run(  # noqa: S603 - uv, arguments built here
        [uv_binary(), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"uv {' '.join(args)} failed ({result.returncode}): {result.stderr}")


def build_release(revision: str, service: str, dest: Path, repo: Path = ROOT) -> Path:
    """``service`` as released at ``revision``: its tree from ``git archive``, its locked
    dependencies (``uv export`` of that tree's uv.lock) and its workspace members installed
    into ``dest/venv`` on this interpreter. The directory of its console scripts."""
    source = dest / "source"
    source.mkdir(parents=True)
    archive = _git("archive", "--format=tar", revision, repo=repo)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    requirements = dest / "requirements.txt"
    _uv(
        "export",
        "--frozen",
        "--no-dev",
        "--no-emit-workspace",
        "--no-header",
        "--quiet",
        "--package",
        service,
        "--output-file",
        str(requirements),
        cwd=source,
    )
    venv = dest / "venv"
    _uv("venv", "--quiet", "--python", sys.executable, str(venv), cwd=dest)
    python = str(venv / "bin" / "python")
    _uv("pip", "install", "--quiet", "--python", python, "-r", str(requirements), cwd=dest)
    members = [str(source / member) for member in (*WORKSPACE_DEPENDENCIES, f"services/{service}")]
    _uv("pip", "install", "--quiet", "--python", python, "--no-deps", *members, cwd=dest)
    return venv / "bin"


def build_previous_release(release: ServiceRelease, dest: Path) -> tuple[Release, Path]:
    """The previous release of ``release`` (``previous_release``), built into ``dest`` by
    ``build_release``: its row of UPGRADING.md and its console script."""
    previous = previous_release(release)
    if previous is None:
        raise AssertionError(f"UPGRADING.md records no release below {release.version}")
    return previous, build_release(previous.commit, release.name, dest) / release.name


class ReleaseRuleChecks:
    """The release rule, the same for every service: the version in pyproject.toml has a
    changelog entry, the chart ships it, the previous release is recorded in UPGRADING.md on a
    commit of main (and its tag, where present, names that commit), released migrations are
    never edited, and every migration added since is expand-only unless UPGRADING.md lists it
    as a contract migration (each service's UPGRADING.md "Versioning policy", "Migrations"). A
    service's test module subclasses it as `TestReleaseRule`, naming its `SERVICE`. This
    module is not rewritten by pytest, so each failure says what it found itself."""

    SERVICE: ClassVar[ServiceRelease]

    def _notes(self, name: str) -> str:
        return (self.SERVICE.directory / name).read_text(encoding="utf-8")

    def _previous(self) -> Release:
        previous = previous_release(self.SERVICE)
        if previous is None:
            raise AssertionError(f"UPGRADING.md records no release below {self.SERVICE.version}")
        return previous

    def test_the_changelog_has_an_entry_for_the_version(self) -> None:
        versions = changelog_versions(self._notes("CHANGELOG.md"))
        _expect(self.SERVICE.version in versions, f"no entry for {self.SERVICE.version}")
        _expect(versions == sorted(versions, reverse=True), f"entries not newest first: {versions}")

    def test_the_chart_runs_the_version(self) -> None:
        chart = ROOT / "infra" / "helm" / self.SERVICE.name / "Chart.yaml"
        found = re.search(r'^appVersion:\s*"?([^"\s]+)"?\s*$', chart.read_text("utf-8"), re.M)
        app_version = found[1] if found else None
        _expect(app_version == str(self.SERVICE.version), f"{chart}: appVersion {app_version}")

    def test_the_previous_release_is_recorded_on_main_and_tagged_where_tags_are(self) -> None:
        previous = self._previous()
        _expect(
            previous.version in changelog_versions(self._notes("CHANGELOG.md")),
            f"no changelog entry for {previous.version}",
        )
        _expect(
            previous.tag == self.SERVICE.tag(previous.version),
            f"{previous.version} recorded with tag {previous.tag}",
        )
        # Every clone of main has the commit; only the repository the tags were pushed to
        # has the tag, and there it must name the same commit.
        _expect(is_ancestor(previous.commit), f"{previous.commit} is not in this clone's history")
        tagged = release_tags(self.SERVICE.name).get(previous.version)
        if tagged is not None:
            commit = _git("rev-parse", f"{tagged}^{{commit}}").decode().strip()
            _expect(commit == previous.commit, f"{tagged} is {commit}, recorded {previous.commit}")

    def test_released_migrations_are_never_edited(self) -> None:
        previous = self._previous()
        released = files_at(previous.commit, self.SERVICE.migrations)
        current = {p.name: p.read_bytes() for p in self.SERVICE.migrations.glob("*.sql")}
        edited = [n for n, b in released.items() if n.endswith(".sql") and current.get(n) != b]
        _expect(not edited, f"changed (or gone) after {previous.tag}: {edited}")

    def test_migrations_since_the_previous_release_are_expand_only(self) -> None:
        released = files_at(self._previous().commit, self.SERVICE.migrations)
        allowed = contract_migrations(self._notes("UPGRADING.md"))
        present = sorted(self.SERVICE.migrations.glob("*.sql"))
        found = {
            p.name: contract_statements(p.read_text(encoding="utf-8"))
            for p in present
            if p.name not in released and p.name not in allowed
        }
        contracting = {name: reasons for name, reasons in found.items() if reasons}
        _expect(not contracting, f"contract statements in new migrations: {contracting}")
        unknown = allowed - {p.name for p in present}
        _expect(not unknown, f"contract migrations listed, not found: {unknown}")

    def test_the_upgrade_notes_state_the_policy(self) -> None:
        text = self._notes("UPGRADING.md")
        for heading in ("Versioning policy", "Migrations", "Contract migrations", "Releases"):
            _expect(bool(re.search(rf"^## {heading}$", text, re.M)), f"no section {heading}")


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
