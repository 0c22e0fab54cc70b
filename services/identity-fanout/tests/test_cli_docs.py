"""The man page and shell completions of `identity-fanout`, generated from its parser as
`make cli-docs` does: every command and flag in them, the page valid roff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from identity_fanout.cli import build_parser
from pin_testkit.cli_docs import commands, missing_from

PROGRAM = "identity-fanout"


def test_the_man_page_and_completions_cover_every_command_and_flag(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pin_testkit.cli_docs", "--out", str(tmp_path), PROGRAM],
        check=True,
        capture_output=True,
    )
    man = (tmp_path / "man" / "man1" / f"{PROGRAM}.1").read_text(encoding="utf-8")
    scripts = {
        "bash": tmp_path / "completion" / "bash" / PROGRAM,
        "zsh": tmp_path / "completion" / "zsh" / f"_{PROGRAM}",
    }
    completions = {shell: path.read_text(encoding="utf-8") for shell, path in scripts.items()}
    parser = build_parser()
    assert missing_from(parser, man, completions) == []
    # The walk reaches every depth, the standalone lag watcher included.
    paths = {command.path for command in commands(parser)}
    assert {("lag-watch",), ("outbox", "quarantine", "discard"), ("roles", "set-permissions")} <= (
        paths
    )
    rendered = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(tmp_path / "man" / "man1" / f"{PROGRAM}.1")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert rendered.stderr == ""
