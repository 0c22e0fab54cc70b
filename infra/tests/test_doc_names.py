"""Names of code quoted in comments and docstrings name code that exists.

Comments and docstrings point at code by dotted names: backticked (`pin_runtime.settings`,
`walk.classify_failure`, `lanes.key_slot`, `sql/tasks.sql`) or bare (pin_runtime.horizon). A
module renamed without them leaves pointers to nothing. Every such name in the comments and
docstrings of the Python files (and in other string literals, when backticked) and the
SQL comments of the members, bench, infra and tests-e2e is resolved here, statically:
nothing runs but imports.

F's scope is F's own package and its parent packages; for a file outside the packages (a
test, a benchmark, infra, tests-e2e) every package of the code it exercises (`SUBJECTS`).
A `/` between names reads as a `.` (`rules/plan.plan_batch`). For a quoted `a.b.c` in F,
the first rule that applies decides:

1. An allowlisted word of another system (`NOT_MODULES`), or a part in lowerCamelCase (a
   Helm or JSON key; this code's names are snake_case): passes.
2. A path (with a `/`) that exists from F's folder, a parent folder or a package of F's
   scope, or the name of a file of the repository (`floor.sql`): passes.
3. A bare name (no backticks) whose `a` is neither a top-level package nor a module of F's
   scope is prose ("e.g.", a Kafka key, a file name): passes.
4. `a` a top-level package: `a.b.c` imports, as a module and then an attribute chain (a
   class's attribute may be its instances': annotated, a msgspec field, a slot, set on
   `self`).
5. A single word: checked only when spelled like a module (snake_case with an underscore).
   It passes as a module of F's scope, a name F binds, a file's stem, or a word the code,
   its SQL, TOML, YAML or documentation uses; else it names a module that is gone.
6. `a` imported by F: it resolves through the import.
7. `a` a module of F's scope: `b.c` resolves in one of them (or `a` is also a variable of
   F, which the comment is about).
8. `a` a class of the repository: `b` is its attribute.
9. `a` an importable module or a builtin type (`psycopg.sql`, `tuple.__new__`): it resolves.
10. `a` spelled like a module while `b` is a top-level name of a module of F's project:
    fails, naming where `b` lives (the module was renamed).
11. `a` a name F binds (a variable, a parameter): passes, the comment is about it.
12. A file name (`relay_metrics.toml`) that no file has: fails.
13. `a` snake_case with an underscore that the code never uses: fails. Anything else
    (`max.message.bytes`, `service.version`, `identity.role_assignments`) is no Python.

Migrations are not read: an applied one is checksummed whole, comments too, so it is not
edited after the fact.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

THIS_FILE = Path(__file__).resolve()
ROOT = THIS_FILE.parents[2]

# Where the code lives: a source root holds top-level packages.
SOURCE_ROOTS = (
    ROOT / "contracts" / "src",
    ROOT / "packages" / "pin-runtime" / "src",
    ROOT / "packages" / "pin-testkit" / "src",
    ROOT / "services" / "identity-fanout" / "src",
    ROOT / "services" / "rewards-membership" / "src",
    ROOT / "tests-e2e",
)
TOP_PACKAGES = (
    "pin_contracts",
    "pin_runtime",
    "pin_testkit",
    "identity_fanout",
    "rewards_membership",
    "pin_e2e",
)
# What a file outside a package exercises: its relative names resolve in these packages.
SUBJECTS = {
    "contracts": ("pin_contracts",),
    "packages/pin-runtime": ("pin_runtime",),
    "packages/pin-testkit": ("pin_testkit",),
    "services/identity-fanout": ("identity_fanout",),
    "services/rewards-membership": ("rewards_membership",),
    "bench/fanout": ("identity_fanout",),
    "bench/relay": ("identity_fanout",),
    "bench/membership": ("rewards_membership",),
    "tests-e2e": TOP_PACKAGES,
    "infra": TOP_PACKAGES,
}
DOCS = tuple(sorted((ROOT / "docs").rglob("*.md")))
SCANNED = ("contracts", "packages", "services", "bench", "infra", "tests-e2e")
SKIPPED_DIRS = {
    *(".git", ".venv", ".tools", ".state", "node_modules", "__pycache__", ".hypothesis"),
    *(".mypy_cache", ".pytest_cache", ".ruff_cache"),
}
FILE_SUFFIXES = {"py", "sql", "toml", "md", "json", "yaml", "yml", "sh", "txt", "mjs", "pml"}

# Backticked words that are no module but are spelled like one. Kept tiny: each is a name of
# another system that happens to share its first part with one of the project's modules.
NOT_MODULES = {
    "slow_close",  # Toxiproxy's toxic types
    "limit_data",
    "_definitions.json",  # a file of the kubernetes-validate wheel
}

TICKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:[./][A-Za-z_][A-Za-z0-9_]*)*)`")
# A dotted name standing alone in prose: not part of a path, a longer name or a call.
BARE = re.compile(r"(?<![\w.`/-])([a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w`/(-])")
STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
CAMEL = re.compile(r"^[a-z]+[A-Z]")
SNAKE_OR_WORD = re.compile(r"^_?[a-z][a-z0-9_]*$")
SNAKE = re.compile(r"^_?[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")


@dataclass(frozen=True)
class Quote:
    path: Path
    line: int
    name: str
    bare: bool = False

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: `{self.name}`"


def scanned_files(*suffixes: str) -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            # This file is left out: its examples of stale names are stale on purpose.
            skipped = SKIPPED_DIRS.intersection(path.parts) or path == THIS_FILE
            if path.suffix in suffixes and not skipped:
                yield path


def quotes_in(path: Path) -> Iterator[Quote]:
    """The names a file's comments and docstrings quote: backticked ones, and bare dotted
    ones (pin_runtime.horizon written without backticks is as much a pointer; `problem`
    checks a bare one only when it starts with a module). Other string literals count only
    with backticks: a bare dotted name there is data (a logger's name, a key)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        previous = tokenize.NEWLINE
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT or (
                token.type == tokenize.STRING and previous in STATEMENT_START
            ):
                yield from _quoted(path, token.start[0], token.string)
            elif token.type == tokenize.STRING:
                yield from _ticked(path, token.start[0], token.string)
            if token.type not in (tokenize.COMMENT, tokenize.NL):
                previous = token.type
        return
    comment = "--"  # the rest is SQL
    for number, line in enumerate(text.splitlines(), start=1):
        if comment in line:
            yield from _quoted(path, number, line[line.index(comment) :])


def _quoted(path: Path, first_line: int, text: str) -> Iterator[Quote]:
    yield from _ticked(path, first_line, text)
    prose = TICKED.sub("", text)
    for match in BARE.finditer(prose):
        line = first_line + prose.count("\n", 0, match.start())
        yield Quote(path, line, match.group(1), bare=True)


def _ticked(path: Path, first_line: int, text: str) -> Iterator[Quote]:
    for match in TICKED.finditer(text):
        line = first_line + text.count("\n", 0, match.start())
        yield Quote(path, line, match.group(1))


@cache
def modules() -> frozenset[str]:
    """Every module and package of the source roots, by dotted name."""
    found: set[str] = set()
    for source in SOURCE_ROOTS:
        for top in TOP_PACKAGES:
            base = source / top
            if not base.is_dir():
                continue
            for path in base.rglob("*.py"):
                parts = list(path.relative_to(source).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found.add(".".join(parts))
    return frozenset(found)


@cache
def file_names() -> frozenset[str]:
    return frozenset(
        path.name
        for path in ROOT.rglob("*")
        if path.is_file() and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts)
    )


@cache
def file_stems() -> frozenset[str]:
    return frozenset(name.split(".")[0] for name in file_names())


@cache
def classes() -> dict[str, list[str]]:
    """Module names defining each class of the source roots."""
    found: dict[str, list[str]] = {}
    for module in modules():
        for node in ast.walk(_module_tree(module)):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return found


def _module_tree(module: str) -> ast.Module:
    for source in SOURCE_ROOTS:
        base = source.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return ast.parse(path.read_text(encoding="utf-8"))
    raise LookupError(module)


@cache
def known_words() -> frozenset[str]:
    """Every identifier and string of the code (docstrings aside) and every word of its SQL,
    TOML, YAML, JSON and Markdown files."""
    words: set[str] = set(dir(builtins))
    for path in scanned_files(".py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(doc) for doc in _docstrings(tree)}
        for node in ast.walk(tree):
            words.update(_bound_by(node))
            if isinstance(node, ast.Attribute):
                words.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                words.add(node.arg)
            elif isinstance(node, ast.Constant) and id(node) not in docstrings:
                words.update(re.findall(r"\w+", str(node.value)))
    for path in [*scanned_files(".sql", ".toml", ".yaml", ".yml", ".json", ".md"), *DOCS]:
        words.update(re.findall(r"\w+", path.read_text(encoding="utf-8")))
    return frozenset(words)


def _docstrings(tree: ast.Module) -> Iterator[ast.Constant]:
    """Strings standing as statements: docstrings of modules, classes, functions and
    attributes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            yield node.value


def _bound_by(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.arg):
        yield node.arg
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name
    elif isinstance(node, ast.alias):
        yield (node.asname or node.name).split(".")[0]


def imports_of(path: Path) -> tuple[dict[str, str], set[str]]:
    """What each imported name of a file stands for, and every other name the file binds."""
    imported: dict[str, str] = {}
    bound: set[str] = set()
    package = _package_of(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    imported[alias.asname] = alias.name
                else:
                    first = alias.name.split(".")[0]
                    imported[first] = first
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level and package:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*parent, origin] if origin else parent)
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{origin}.{alias.name}"
        else:
            bound.update(_bound_by(node))
    return imported, bound - set(imported)


def _package_of(path: Path) -> str | None:
    for source in SOURCE_ROOTS:
        if path.is_relative_to(source) and path.relative_to(source).parts[0] in TOP_PACKAGES:
            return ".".join(path.parent.relative_to(source).parts)
    return None


def scope_of(path: Path) -> list[str]:
    """The packages a file's relative names resolve in: its own and its parents, or, for a
    file outside the packages, every package of the code it exercises."""
    package = _package_of(path)
    if package:
        parts = package.split(".")
        return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
    relative = path.relative_to(ROOT).as_posix()
    for prefix, subjects in SUBJECTS.items():
        if relative.startswith(prefix + "/"):
            return [m for m in modules() if m.split(".")[0] in subjects and _is_package(m)]
    return []


def _folders(packages: list[str]) -> list[Path]:
    return [
        folder
        for package in packages
        for source in SOURCE_ROOTS
        if (folder := source.joinpath(*package.split("."))).is_dir()
    ]


def _is_package(module: str) -> bool:
    return any(
        source.joinpath(*module.split("."), "__init__.py").is_file() for source in SOURCE_ROOTS
    )


def resolves(dotted: str) -> bool:
    """Whether `dotted` is a module, or an attribute chain of its longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in modules() or (cut == 1 and _importable(head)):
            break
    else:
        return hasattr(builtins, parts[0]) and _has_chain(getattr(builtins, parts[0]), parts[1:])
    # A module of the repository that fails to import fails the test with its own error.
    return _has_chain(importlib.import_module(head), parts[cut:])


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _has_chain(target: Any, attributes: list[str]) -> bool:
    for attribute in attributes:
        if inspect.ismodule(target) and f"{target.__name__}.{attribute}" in modules():
            target = importlib.import_module(f"{target.__name__}.{attribute}")
        elif hasattr(target, attribute):
            target = getattr(target, attribute)
        elif inspect.isclass(target) and attribute in _instance_attributes(target):
            return True  # an instance's attribute: what it holds is not known statically
        elif inspect.ismodule(target) and _importable(f"{target.__name__}.{attribute}"):
            target = importlib.import_module(f"{target.__name__}.{attribute}")
        else:
            return False
    return True


def _instance_attributes(cls: type) -> set[str]:
    """Fields and attributes a class's instances carry: annotations, msgspec fields, slots
    and the `self.x` its methods assign."""
    names: set[str] = set()
    for klass in cls.__mro__:
        names.update(getattr(klass, "__annotations__", {}))
        names.update(getattr(klass, "__struct_fields__", ()))
        names.update(getattr(klass, "__slots__", ()))
        try:
            tree = ast.parse(inspect.getsource(klass).strip())
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return names


def problem(quote: Quote) -> str | None:
    """Why a quote names nothing, or None when it resolves or names no code."""
    if _passes_as_written(quote):
        return None
    name = quote.name.replace("/", ".")
    parts = name.split(".")
    if parts[0] in TOP_PACKAGES:
        return None if resolves(name) else "does not import"
    imported, bound = imports_of(quote.path) if quote.path.suffix == ".py" else ({}, set())
    if len(parts) == 1:
        return _word_problem(name, quote.path, imported, bound)
    return _relative_problem(parts, quote.path, imported, bound)


def _passes_as_written(quote: Quote) -> bool:
    parts = re.split(r"[./]", quote.name)
    return (
        quote.name in NOT_MODULES
        or any(CAMEL.match(part) for part in parts)
        or _is_file(quote.name, quote.path)
        or (quote.bare and not _starts_with_a_module(parts[0], quote.path))
    )


def _relative_problem(
    parts: list[str], path: Path, imported: dict[str, str], bound: set[str]
) -> str | None:
    name = ".".join(parts)
    if parts[0] in imported:
        target = imported[parts[0]]
        return None if resolves(".".join([target, *parts[1:]])) else "not in what it imports"
    scope = scope_of(path)
    if any(f"{package}.{parts[0]}" in modules() for package in scope):
        # A variable may share a module's name: the comment may be about the variable.
        found = any(resolves(f"{package}.{name}") for package in scope) or parts[0] in bound
        return None if found else "not in that module"
    if parts[0] in classes():
        owners = classes()[parts[0]]
        return None if any(resolves(f"{owner}.{name}") for owner in owners) else "no attribute"
    if _importable(parts[0]) or isinstance(getattr(builtins, parts[0], None), type):
        return None if resolves(name) else "does not import"
    return _unknown_problem(parts, scope, bound)


def _unknown_problem(parts: list[str], scope: list[str], bound: set[str]) -> str | None:
    """A name whose first part is no module, class or import of the file's reach."""
    projects = {package.split(".")[0] for package in scope}
    homes = [module for module in _homes(parts[1]) if module.split(".")[0] in projects]
    if homes and SNAKE_OR_WORD.match(parts[0]) and parts[0] not in {"self", "cls"}:
        return "`{}` is defined in `{}`".format(parts[1], "`, `".join(homes))
    if parts[0] in bound:
        return None
    if parts[-1] in FILE_SUFFIXES:
        return "no file of that name"
    if SNAKE.match(parts[0]) and parts[0] not in known_words():
        return "no module of that name, and the code uses no such name"
    return None


def _starts_with_a_module(first: str, path: Path) -> bool:
    return first in TOP_PACKAGES or any(
        f"{package}.{first}" in modules() for package in scope_of(path)
    )


def _is_file(name: str, path: Path) -> bool:
    """Whether a quote is a file of the repository: a path from the file's folder or one of
    its parents, or a bare file name of any folder."""
    if "/" in name:
        folders = [f for f in path.parents if f.is_relative_to(ROOT)] + _folders(scope_of(path))
        return any((folder / name).exists() for folder in folders)
    return name.rsplit(".", 1)[-1] in FILE_SUFFIXES and name in file_names()


@cache
def _homes(attribute: str) -> tuple[str, ...]:
    """The modules whose top level defines `attribute` (a function, class or constant)."""
    return tuple(sorted(m for m in modules() if attribute in _top_level_names(m)))


@cache
def _top_level_names(module: str) -> frozenset[str]:
    names: set[str] = set()
    for node in _module_tree(module).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(names)


def _word_problem(word: str, path: Path, imported: dict[str, str], bound: set[str]) -> str | None:
    if not SNAKE.match(word) or word in imported or word in bound or word in file_stems():
        return None
    if any(f"{package}.{word}" in modules() for package in scope_of(path)):
        return None
    if word in known_words() or word in modules():
        return None
    return "no module of that name, and the code uses no such name"


def test_quoted_names_resolve() -> None:
    quotes = [
        quote
        for path in scanned_files(".py", ".sql")
        # An applied migration is checksummed whole: its comments are as frozen as its SQL.
        if "migrations" not in path.parts
        for quote in quotes_in(path)
    ]
    assert len(quotes) > 1000, "the scan found too few quotes: is it reading the files?"
    unresolved = [f"{quote}: {why}" for quote in quotes if (why := problem(quote))]
    assert not unresolved, "names of nothing in comments:\n" + "\n".join(unresolved)


def test_the_rule_tells_a_renamed_module_from_a_live_one() -> None:
    here = ROOT / "services/identity-fanout/src/identity_fanout/ops/tasks.py"
    live = [
        "fanout.queue.FanOutTask",
        "quarantine",
        "identity_fanout.fanout.queue.retry_delay",
        "FanoutQueue.claim",
        "fanout/sql/tasks.sql",
        "max.message.bytes",
    ]
    assert [name for name in live if problem(Quote(here, 1, name))] == []
    gone = [
        "fanout.queue.no_such_function",
        "identity_fanout.nowhere",
        "task_queue.FanOutTask",
        "task_queue",
        "relay_metrics.toml",
    ]
    assert [name for name in gone if problem(Quote(here, 1, name)) is None] == []
