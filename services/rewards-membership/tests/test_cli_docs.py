"""The man page and shell completions of `rewards-membership`, generated from its parser as
`make cli-docs` does: every command and flag in them, the page valid roff
(`pin_testkit.cli_docs.check_generated`)."""

from __future__ import annotations

from pathlib import Path

from pin_testkit.cli_docs import check_generated


def test_the_man_page_and_completions_cover_every_command_and_flag(tmp_path: Path) -> None:
    paths = check_generated("rewards-membership", tmp_path)
    # The walk reaches every depth, the standalone lag watcher included.
    assert {("lag-watch",), ("dlq", "resolve"), ("inbox", "prune")} <= paths
