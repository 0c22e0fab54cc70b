"""A service's man page and shell completion, generated from the parser its command runs with.

    python -m pin_testkit.cli_docs --out build/cli identity-fanout rewards-membership

writes, for each console script named, ``man/man1/<prog>.1`` (roff: every command, its usage,
arguments and options), ``completion/bash/<prog>`` and ``completion/zsh/_<prog>`` (shtab;
its tcsh script flattens every command's options into one list, so it is left out). The
parser is found through the console script itself: its entry point is ``<module>:main`` and
that module has ``build_parser()``, the parser ``main`` parses with. Nothing is written by
hand, so a command or flag added to a parser is in both at the next build, and
``missing_from`` (the services' tests) fails when one is not.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

import shtab

__all__ = [
    "SHELLS",
    "CliDocs",
    "Command",
    "check_generated",
    "commands",
    "completion",
    "generate",
    "load_parser",
    "main",
    "manpage",
    "missing_from",
    "roff_escape",
]

SHELLS: Final = ("bash", "zsh")
_WIDTH: Final = 78  # usage lines wrapped the same on every terminal: reproducible files
_EXIT_STATUS: Final = (
    ("0", "done."),
    (
        "1",
        "a typed error of the service (an unknown role, a task that is not Failed, ...), a "
        "dependency that could not be reached, or a statement the database refused; one line "
        "on stderr.",
    ),
    (
        "2",
        "bad usage (an argument the parser refused) or configuration (config error: "
        "VARIABLE: reason); one line on stderr.",
    ),
)


@dataclass(frozen=True, slots=True)
class Command:
    """One command of a parser: ``path`` () for the program itself, ``("outbox",
    "quarantine", "list")`` for a nested one."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str | None

    def options(self) -> list[argparse.Action]:
        """Its flags (``--json``, ``-h/--help``), in the parser's order."""
        return [a for a in self.parser._actions if a.option_strings and a.help != argparse.SUPPRESS]

    def positionals(self) -> list[argparse.Action]:
        """Its positional arguments, without the sub-command slot."""
        return [
            a
            for a in self.parser._actions
            if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
        ]


def commands(parser: argparse.ArgumentParser) -> list[Command]:
    """The program and every command under it, depth first, at any depth."""
    found = [Command((), parser, parser.description)]

    def walk(current: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in current._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append(Command((*path, name), sub, helps.get(name)))
                walk(sub, (*path, name))

    walk(parser, ())
    return found


def load_parser(program: str) -> argparse.ArgumentParser:
    """The parser of the installed console script ``program`` (``<module>:main``, whose
    module has ``build_parser()``)."""
    scripts = importlib.metadata.entry_points(group="console_scripts", name=program)
    if not scripts:
        raise LookupError(f"no console script {program!r} is installed")
    (script,) = scripts
    module = importlib.import_module(script.module)
    build = getattr(module, "build_parser", None)
    if not callable(build):
        raise TypeError(f"{script.module} (console script {program}) has no build_parser()")
    parser = cast(Callable[[], argparse.ArgumentParser], build)()
    if not isinstance(parser, argparse.ArgumentParser):
        raise TypeError(f"{script.module}.build_parser() returned {type(parser).__name__}")
    return parser


# -- the man page ----------------------------------------------------------------------------


def roff_escape(text: str) -> str:
    """``text`` as roff prints it: backslashes and hyphens literal, no line read as a request,
    a character beyond ASCII by its Unicode name (groff reads its input as Latin-1)."""
    escaped = "".join(
        char if ord(char) < 128 else f"\\[u{ord(char):04X}]"  # noqa: PLR2004 - ASCII's end
        for char in text.replace("\\", "\\e").replace("-", "\\-")
    )
    return "\n".join(
        f"\\&{line}" if line.startswith((".", "'")) else line for line in escaped.splitlines()
    )


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=_WIDTH)


def _usage(command: Command) -> str:
    formatter = _formatter(command.parser.prog)
    parser = command.parser
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, "")
    return formatter.format_help().strip()


def _help(action: argparse.Action, prog: str) -> str:
    if not action.help:
        return ""
    return _formatter(prog)._expand_help(action)


def _action_item(action: argparse.Action, prog: str) -> Iterator[str]:
    invocation = _formatter(prog)._format_action_invocation(action)
    yield ".TP"
    yield f"\\fB{roff_escape(invocation)}\\fR"
    text = _help(action, prog)
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        listed = ", ".join(str(choice) for choice in action.choices)
        text = f"{text} (one of: {listed})" if text else f"one of: {listed}"
    yield roff_escape(text) if text else "\\&"


def manpage(parser: argparse.ArgumentParser, *, version: str) -> str:
    """The program's man page (section 1) in roff: every command at every depth with its
    usage, positional arguments and options."""
    prog = parser.prog
    found = commands(parser)
    summary = (parser.description or prog).split(". ")[0].rstrip(".")
    lines = [
        f'.TH "{prog.upper()}" "1" "" "{prog} {version}" "PIN platform"',
        ".SH NAME",
        f"{roff_escape(prog)} \\- {roff_escape(summary)}",
        ".SH SYNOPSIS",
        ".nf",
        roff_escape(_usage(found[0])),
        ".fi",
        ".SH DESCRIPTION",
        roff_escape(parser.description or ""),
        ".SH OPTIONS",
    ]
    for action in found[0].options():
        lines.extend(_action_item(action, prog))
    lines.append(".SH COMMANDS")
    for command in found[1:]:
        lines.append(f'.SS "{roff_escape(" ".join((prog, *command.path)))}"')
        if command.help:
            lines.extend((roff_escape(command.help[:1].upper() + command.help[1:]) + ".", ".PP"))
        lines.extend((".nf", roff_escape(_usage(command)), ".fi"))
        for action in (*command.positionals(), *command.options()):
            lines.extend(_action_item(action, command.parser.prog))
    lines.append(".SH EXIT STATUS")
    for code, meaning in _EXIT_STATUS:
        lines.extend((".TP", f"\\fB{code}\\fR", roff_escape(meaning)))
    return "\n".join(lines) + "\n"


# -- completion ------------------------------------------------------------------------------


def completion(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``shell`` (one of ``SHELLS``), by shtab."""
    if shell not in SHELLS:
        raise ValueError(f"shell {shell!r}: one of {', '.join(SHELLS)}")
    return str(shtab.complete(parser, shell=shell))


def _completion_path(prog: str, shell: str) -> Path:
    name = {"bash": prog, "zsh": f"_{prog}"}[shell]
    return Path("completion") / shell / name


@dataclass(frozen=True, slots=True)
class CliDocs:
    """What ``generate`` wrote for one program."""

    man: Path
    completions: dict[str, Path]

    def texts(self) -> tuple[str, dict[str, str]]:
        return self.man.read_text(encoding="utf-8"), {
            shell: path.read_text(encoding="utf-8") for shell, path in self.completions.items()
        }


def generate(parser: argparse.ArgumentParser, out: Path, *, version: str) -> CliDocs:
    """Write the program's man page and completions under ``out``."""
    prog = parser.prog
    man = out / "man" / "man1" / f"{prog}.1"
    man.parent.mkdir(parents=True, exist_ok=True)
    man.write_text(manpage(parser, version=version), encoding="utf-8")
    written: dict[str, Path] = {}
    for shell in SHELLS:
        path = out / _completion_path(prog, shell)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(completion(parser, shell), encoding="utf-8")
        written[shell] = path
    return CliDocs(man, written)


# -- drift -----------------------------------------------------------------------------------


def _man_sections(man: str, prog: str) -> dict[tuple[str, ...], str]:
    """Each command's ``.SS`` section of a man page, by its path."""
    sections: dict[tuple[str, ...], str] = {}
    pattern = re.compile(r'^\.SS "(?P<title>[^"]*)"$', re.M)
    matches = list(pattern.finditer(man))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(man)
        words = match["title"].replace("\\-", "-").split(" ")
        if words[0] == prog:
            sections[tuple(words[1:])] = man[match.end() : end]
    return sections


_BASH_OPTIONS: Final = re.compile(
    r"^_shtab_(?P<command>\w+)_option_strings=\((?P<options>.*)\)$", re.M
)


def _bash_options(script: str) -> dict[str, set[str]]:
    """The option strings shtab's bash script completes, by command (its array names)."""
    return {m["command"]: set(m["options"].split()) for m in _BASH_OPTIONS.finditer(script)}


def _bash_name(prog: str, path: tuple[str, ...]) -> str:
    return re.sub(r"\W", "_", "_".join((prog, *path)))


def _in_script(shell: str, script: str, bash: dict[str, set[str]], name: str, option: str) -> bool:
    """Whether ``option`` of command ``name`` (its bash array name) is in ``script``: in that
    command's own list for bash, anywhere as a word for zsh."""
    if shell == "bash":
        return option in bash.get(name, set())
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", script) is not None


def _missing_in_man(command: Command, name: str, section: str) -> Iterator[str]:
    for action in command.options():
        for option in action.option_strings:
            if roff_escape(option) not in section:
                yield f"man: {name} has no {option}"
    for action in command.positionals():
        metavar = _formatter(name)._format_action_invocation(action)
        if roff_escape(metavar) not in section:
            yield f"man: {name} has no argument {metavar}"


def _missing_in_scripts(
    command: Command, name: str, completions: dict[str, str], bash: dict[str, set[str]]
) -> Iterator[str]:
    prog = name.split(" ", maxsplit=1)[0]
    for shell, script in completions.items():
        if command.path and not re.search(
            rf"(?<![\w-]){re.escape(command.path[-1])}(?![\w-])", script
        ):
            yield f"{shell}: no command {name!r}"
        for action in command.options():
            for option in action.option_strings:
                if not _in_script(shell, script, bash, _bash_name(prog, command.path), option):
                    yield f"{shell}: {name} has no {option}"


def missing_from(
    parser: argparse.ArgumentParser, man: str, completions: dict[str, str]
) -> list[str]:
    """What of the parser a generated man page or completion script lacks: every command (in
    its own man page section, and by name in each script) and every option string and
    positional argument of it (a bash script: in the command's own list). Empty when they
    cover the parser."""
    prog = parser.prog
    sections = {(): man.split("\n.SH COMMANDS", 1)[0], **_man_sections(man, prog)}
    bash = _bash_options(completions.get("bash", ""))
    missing: list[str] = []
    for command in commands(parser):
        name = " ".join((prog, *command.path))
        section = sections.get(command.path)
        if section is None:
            missing.append(f"man: no section for {name!r}")
            continue
        missing.extend(_missing_in_man(command, name, section))
        missing.extend(_missing_in_scripts(command, name, completions, bash))
    return missing


def check_generated(program: str, out: Path) -> set[tuple[str, ...]]:
    """Generate `program`'s man page and completions into `out` as `make cli-docs` does (this
    module run as a script), and fail (AssertionError) when they lack a command or flag of
    its parser or the page is not clean roff under groff; the command paths found, for the
    caller to check the depths it expects."""
    subprocess.run(  # noqa: S603 - this module as a script, arguments built here
        [sys.executable, "-m", "pin_testkit.cli_docs", "--out", str(out), program],
        check=True,
        capture_output=True,
    )
    page = out / "man" / "man1" / f"{program}.1"
    completions = {
        shell: (out / _completion_path(program, shell)).read_text(encoding="utf-8")
        for shell in SHELLS
    }
    parser = load_parser(program)
    missing = missing_from(parser, page.read_text(encoding="utf-8"), completions)
    if missing:
        raise AssertionError(f"{program}: generated docs lack {missing}")
    rendered = subprocess.run(  # noqa: S603 - groff on the page just written
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(page)],  # noqa: S607 - groff of the PATH
        capture_output=True,
        text=True,
        check=True,
    )
    if rendered.stderr:
        raise AssertionError(f"{program}: groff warns: {rendered.stderr}")
    return {command.path for command in commands(parser)}


def main(argv: Sequence[str] | None = None) -> int:
    cli = argparse.ArgumentParser(
        prog="python -m pin_testkit.cli_docs",
        description="Man pages and shell completions of console scripts, from their parsers.",
    )
    cli.add_argument("--out", type=Path, required=True, help="directory to write into")
    cli.add_argument("programs", nargs="+", metavar="PROGRAM", help="console script names")
    args = cli.parse_args(argv)
    for program in args.programs:
        try:
            parser = load_parser(program)
            version = importlib.metadata.version(program)
        except (LookupError, TypeError, importlib.metadata.PackageNotFoundError) as exc:
            sys.stderr.write(f"{program}: {exc}\n")
            return 1
        docs = generate(parser, args.out, version=version)
        sys.stdout.write(
            f"{program} {version}: {docs.man}, "
            + ", ".join(str(p) for p in docs.completions.values())
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
