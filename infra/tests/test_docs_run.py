"""Commands in the documentation run as written (README.md "Contributing").

A shell block fenced as ```sh runnable is run with bash from the repository root and must
exit 0. Every other shell block of the READMEs and design notes is checked without running
it: each `make` target it names is a target of the Makefile, each path of the repository it
names exists (a path git ignores, made by a run, need not), a repository script it runs is
executable, and it calls no bare `uv run` / `uv sync` (uv is on the PATH only when the
developer put it there; `make sync` puts it in .tools/uv/bin: `make run CMD=...` finds it).
docs/runbooks/ are left out: an operator runs those against a cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = "sh runnable"
SHELL_INFOS = frozenset({"sh", "bash", "shell", "console", RUNNABLE})
LEFT_OUT = ("docs/runbooks/",)
RUN_TIMEOUT = 60.0

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_SUBSTITUTION = re.compile(r"\$\(((?:[^()]|\([^()]*\))*)\)")
_OPERATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "|&", ";;"})
_PLACEHOLDER = re.compile(r"[<>*?$…{}\[\]]|\.\.\.")
_MAKE_OPTIONS_WITH_VALUE = frozenset({"-C", "-f", "-j", "-o", "-W", "--directory", "--file"})


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    info: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"


def blocks_of(document: str, text: str) -> list[Block]:
    """The shell blocks of one Markdown text, with the line their fence opens on."""
    found = []
    for match in _FENCE.finditer(text):
        info = " ".join(match.group(1).split())
        if info in SHELL_INFOS:
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(document, line, info, match.group(2)))
    return found


@cache
def documents() -> tuple[str, ...]:
    listed = subprocess.run(
        ["git", "ls-files", "--", "*.md"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    return tuple(d for d in listed if not d.startswith(LEFT_OUT))


def all_blocks() -> list[Block]:
    return [
        block
        for document in documents()
        for block in blocks_of(document, (ROOT / document).read_text(encoding="utf-8"))
    ]


@cache
def make_targets(makefile: Path = ROOT / "Makefile") -> frozenset[str]:
    targets: set[str] = set()
    for line in makefile.read_text(encoding="utf-8").splitlines():
        rule = re.match(r"^([A-Za-z0-9_./-]+(?:\s+[A-Za-z0-9_./-]+)*)\s*:(?![:=])", line)
        if rule and not line.startswith((".PHONY", "\t")):
            targets.update(rule.group(1).split())
    return frozenset(targets)


@cache
def top_level_dirs(root: Path = ROOT) -> tuple[str, ...]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.split()
    return tuple(sorted({f"{p.split('/', 1)[0]}/" for p in listed if "/" in p}))


def _ignored(path: str, root: Path) -> bool:
    # As a file and as a directory: a pattern for a directory (`.state/`) matches a path
    # that does not exist only when it is named as one.
    return any(
        subprocess.run(["git", "check-ignore", "-q", name], cwd=root, check=False).returncode == 0
        for name in (path, f"{path}/")
    )


def _logical_lines(text: str) -> list[str]:
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def _words(line: str) -> list[str]:
    """The shell words of one line, operators apart; comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: the line is prose, not a command
        return []


def _commands(line: str) -> list[list[str]]:
    """Each simple command of `line` and of every `$(...)` in it, as its words."""
    commands: list[list[str]] = []
    for inner in _SUBSTITUTION.findall(line):
        commands.extend(_commands(inner))
    current: list[str] = []
    for word in _words(line):
        if word in _OPERATORS:
            if current:
                commands.append(current)
            current = []
        else:
            current.append(word)
    if current:
        commands.append(current)
    return commands


def _values(word: str) -> list[str]:
    """The word, and the value of a `NAME=value` or `--option=value` word."""
    name, sep, value = word.partition("=")
    if sep and re.fullmatch(r"-{0,2}[A-Za-z_][A-Za-z0-9_.-]*", name):
        return [value] if value else []
    return [word]


def problems_of(block: Block, root: Path = ROOT) -> list[str]:
    """What in `block` does not exist or would not run as written (empty: nothing)."""
    found: list[str] = []
    prefixes = top_level_dirs(root)
    targets = make_targets(root / "Makefile")

    def check_path(word: str, *, program: bool) -> None:
        path = word.split("::", 1)[0].rstrip("/")
        named = path.startswith(prefixes) or f"{path}/" in prefixes
        if not named or _PLACEHOLDER.search(path):
            return
        target = root / path
        if not target.exists():
            if not _ignored(path, root):
                found.append(f"{block.where}: no such path {path!r}")
        elif program and not os.access(target, os.X_OK):
            found.append(f"{block.where}: {path!r} is not executable")

    def check(words: list[str]) -> None:
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            check_values(words[0])
            words = words[1:]
        if not words:
            return
        program, args = words[0], words[1:]
        if program in ("eval", "exec", "time", "sudo", "!"):
            check(args)
            return
        if program == "uv" and args[:1] in (["run"], ["sync"]):
            found.append(
                f"{block.where}: bare `uv {args[0]}` (uv may not be on the PATH; "
                'use a make target or make run CMD="...")'
            )
        if program == "make":
            check_make(args)
            return
        check_path(program, program=True)
        for arg in args:
            check_values(arg)

    def check_make(args: list[str]) -> None:
        options = iter(args)
        for arg in options:
            if arg in _MAKE_OPTIONS_WITH_VALUE:
                next(options, None)  # the option's value
            elif arg.startswith("CMD="):
                for command in _commands(arg.removeprefix("CMD=")):  # what `make run` runs
                    check(command)
            elif "=" in arg:
                check_values(arg)
            elif not arg.startswith("-") and arg not in targets:
                found.append(f"{block.where}: no make target {arg!r}")

    def check_values(word: str) -> None:
        for value in _values(word):
            check_path(value, program=False)

    for line in _logical_lines(block.text):
        for words in _commands(line):
            check(words)
    return found


def run_block(block: Block, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
        env={**os.environ, "MAKEFLAGS": ""},  # not the caller's make, if one runs the tests
    )


def test_every_shell_block_names_targets_paths_and_commands_that_exist() -> None:
    blocks = all_blocks()
    assert len(blocks) > 20, "the documents' shell blocks were not found"
    problems = [problem for block in blocks for problem in problems_of(block)]
    assert problems == []


RUNNABLE_BLOCKS = [block for block in all_blocks() if block.info == RUNNABLE]


def test_the_documents_mark_runnable_blocks() -> None:
    marked = {block.document for block in RUNNABLE_BLOCKS}
    assert {"README.md", "contracts/README.md"} <= marked


@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=[b.where for b in RUNNABLE_BLOCKS])
def test_each_runnable_block_runs_as_written(block: Block) -> None:
    done = run_block(block)
    assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stderr}"


def test_a_drifted_block_fails_the_checks(tmp_path: Path) -> None:
    drifted = """
```sh
uv run --frozen --all-packages pytest contracts/tests
eval "$(uv run --frozen --all-packages pin-local -q env)"
make no-such-target && make test-one T=services/no-such-service/tests
infra/checks/no-such-check.sh
make run CMD="pytest contracts/no_such_test.py"
```

```sh runnable
make run CMD="python -m pin_contracts.no_such_module"
```
"""
    plain, runnable = blocks_of("drifted.md", drifted)
    problems = problems_of(plain)
    assert [p.split(": ", 1)[1].split(" ", 2)[:2] for p in problems] == [
        ["bare", "`uv"],
        ["bare", "`uv"],
        ["no", "make"],
        ["no", "such"],
        ["no", "such"],
        ["no", "such"],
    ], problems
    assert "'no-such-target'" in problems[2]
    assert "'services/no-such-service/tests'" in problems[3]
    assert "'infra/checks/no-such-check.sh'" in problems[4]
    assert "'contracts/no_such_test.py'" in problems[5]
    assert run_block(runnable).returncode != 0
    # The blocks as the documents have them pass the same checks.
    fixed = """
```sh
make run CMD="pytest contracts/tests"
eval "$(make -s run CMD='pin-local -q env')"
make test-one T=services/rewards-membership/tests
infra/checks/asyncapi.sh
rm -rf infra/local/.state
```
"""
    [good] = blocks_of("fixed.md", fixed)
    assert problems_of(good) == []


def _chart_grace(service: str) -> int:
    values = yaml.safe_load((ROOT / "infra/helm" / service / "values.yaml").read_text())
    return int(values["terminationGracePeriodSeconds"])


def test_documented_grace_periods_are_the_charts() -> None:
    infra = (ROOT / "infra/README.md").read_text(encoding="utf-8")
    [paragraph] = [p for p in infra.split("\n\n") if "terminationGracePeriodSeconds" in p]
    documented = {
        s: int(n) for s, n in re.findall(r"(identity-fanout|rewards-membership) (\d+) s", paragraph)
    }
    services = {"identity-fanout", "rewards-membership"}
    assert documented == {service: _chart_grace(service) for service in services}
    rewards = (ROOT / "services/rewards-membership/README.md").read_text(encoding="utf-8")
    [said] = re.findall(r"`terminationGracePeriodSeconds` is (\d+) s", rewards)
    assert int(said) == _chart_grace("rewards-membership")
