"""pin_testkit.cli_docs: man page and completions from a parser, and the drift check."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pin_testkit.cli_docs import commands, generate, manpage, missing_from, roff_escape


def toy() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy", description="A toy. Configured by TOY_*.")
    parser.add_argument("--version", action="store_true", help="print the version")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("migrate", help="apply the migrations")
    queue = sub.add_parser("queue", help="queue commands").add_subparsers(dest="q", required=True)
    drop = queue.add_parser("drop", help="drop a row")
    drop.add_argument("row_id", metavar="ID", type=int)
    drop.add_argument("--reason", required=True, help="why (default: %(default)s)")
    drop.add_argument("--dry-run", action="store_true", help=".starts with a dot \\ backslash")
    listing = queue.add_parser("list", help="list rows")
    listing.add_argument("--status", choices=("a", "b"))
    return parser


def test_commands_are_walked_at_every_depth() -> None:
    paths = [c.path for c in commands(toy())]
    assert paths == [(), ("migrate",), ("queue",), ("queue", "drop"), ("queue", "list")]


def test_the_man_page_has_a_section_per_command_with_its_arguments() -> None:
    man = manpage(toy(), version="1.2.3")
    assert man.startswith('.TH "TOY" "1" "" "toy 1.2.3"')
    assert '.SS "toy queue drop"' in man
    assert "\\fB\\-\\-reason REASON\\fR" in man
    assert "\\fBID\\fR" in man
    assert "why (default: None)" in man
    assert "one of: a, b" in man
    # A help text never becomes a roff request, a backslash stays a backslash.
    assert "\\&\\&.starts" not in man
    assert "\n.starts" not in man
    assert "\\e backslash" in man


def test_generate_writes_the_page_and_a_script_per_shell(tmp_path: Path) -> None:
    docs = generate(toy(), tmp_path, version="1.2.3")
    man, scripts = docs.texts()
    assert docs.man == tmp_path / "man" / "man1" / "toy.1"
    assert set(scripts) == {"bash", "zsh"}
    assert missing_from(toy(), man, scripts) == []


def test_drift_is_found(tmp_path: Path) -> None:
    """A flag a parser gained after the files were generated is reported, by file."""
    man, scripts = generate(toy(), tmp_path, version="1").texts()
    grown = toy()
    (sub,) = (a for a in grown._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices["migrate"].add_argument("--target", help="stop at this migration")
    sub.add_parser("prune", help="delete old marks")
    missing = missing_from(grown, man, scripts)
    assert "man: toy migrate has no --target" in missing
    assert "bash: toy migrate has no --target" in missing
    assert "man: no section for 'toy prune'" in missing


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("--all", "\\-\\-all"),
        (".x", "\\&.x"),
        ("'q", "\\&'q"),
        ("a\\b", "a\\eb"),
        ("a \u2026 b", "a \\[u2026] b"),
    ],
)
def test_roff_escape(text: str, escaped: str) -> None:
    assert roff_escape(text) == escaped
