"""Run the install step of a service's image target without a Docker engine.

    python image_install.py infra/docker/Dockerfile identity-fanout WORK_DIR

The build context is made from the checkout as Docker would (the repository's files filtered
by `/.dockerignore`), the Dockerfile's `RUN uv sync --package SERVICE ...` runs in it with the
`ENV` of its stage and the stages it builds on (the environment directory moved under
WORK_DIR), and then, from outside the checkout with an empty environment, the installed
console script must answer `--help` for each of its commands. The environment must hold no
development tools and no other service. Exit code 1 with the reason on failure.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What the image must not contain: the dev group's tools and the other services.
FORBIDDEN = ("pytest", "mypy", "ruff", "hypothesis", "pin_testkit")
SERVICES = {"identity-fanout": "identity_fanout", "rewards-membership": "rewards_membership"}


class CheckError(Exception):
    """The install step, or what it installed, is not what the image needs."""


@dataclass
class BuildStage:
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    copies: list[tuple[list[str], str]] = field(default_factory=list)
    run: list[str] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for line in joined.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        keyword, _, rest = stripped.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def build_stage(dockerfile: Path, service: str) -> BuildStage:
    """The stage that runs `uv sync --package SERVICE`, with what it inherits from the stages
    it is built `FROM` (their ENV, WORKDIR and COPY from the context)."""
    stages: dict[str, BuildStage] = {}
    stage: BuildStage | None = None
    for keyword, args in instructions(dockerfile.read_text(encoding="utf-8")):
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            parent = stages.get(words[0])
            stage = BuildStage() if parent is None else _inherit(parent)
            if len(words) == 3 and words[1].upper() == "AS":  # noqa: PLR2004 - FROM x AS name
                stages[words[2]] = stage
        elif stage is None:
            continue
        elif keyword == "ENV":
            for token in shlex.split(args):
                name, sep, value = token.partition("=")
                if not sep:
                    raise CheckError(f"ENV without '=' is not supported: {args}")
                stage.env[name] = value
        elif keyword == "WORKDIR":
            stage.workdir = args
        elif keyword == "COPY" and "--from=" not in args:
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            stage.copies.append((parts[:-1], parts[-1]))
        elif keyword == "RUN" and "uv sync" in args:
            tokens = [t for t in shlex.split(args) if not t.startswith("--mount=")]
            if _package(tokens) == service:
                stage.run = tokens
                return stage
    raise CheckError(f"{dockerfile}: no stage runs `uv sync --package {service}`")


def _inherit(parent: BuildStage) -> BuildStage:
    return BuildStage(dict(parent.env), parent.workdir, list(parent.copies), list(parent.run))


def _package(tokens: list[str]) -> str | None:
    return tokens[tokens.index("--package") + 1] if "--package" in tokens else None


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regular expression."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "(?:/.*)?")


def dockerignore(root: Path) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    path = root / ".dockerignore"
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        rules.append((negate, _pattern_regex(pattern.strip("/"))))
    return rules


def excluded(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last matching pattern decides."""
    result = False
    for negate, regex in rules:
        if regex.fullmatch(relative):
            result = not negate
    return result


def context_files(root: Path) -> list[str]:
    """Files Docker would send: the checkout (tracked and new files) less .dockerignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],  # noqa: S607
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    rules = dockerignore(root)
    return sorted(
        name
        for name in listed.split("\0")
        if name and (root / name).is_file() and not excluded(name, rules)
    )


def make_context(root: Path, target: Path, stage: BuildStage) -> Path:
    """Copy the context into `target` the way the stage's COPY instructions place it."""
    files = context_files(root)
    workdir = target / stage.workdir.lstrip("/")
    for sources, destination in stage.copies:
        if sources != ["."] or destination not in (".", "./"):
            raise CheckError(f"only `COPY . .` is emulated, got COPY {sources} {destination}")
        for name in files:
            dest = workdir / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, dest)
    return workdir


def _commands(script: Path) -> list[str]:
    """The sub-commands a console script lists in its `--help` (`{a,b}` or an indented list)."""
    text = subprocess.run(  # noqa: S603 - the console script this check installed
        [str(script), "--help"], capture_output=True, text=True, check=True, env=_bare_env()
    ).stdout
    braces = re.search(r"\{([a-z,-]+)\}", text)
    if braces:
        return braces.group(1).split(",")
    section = text.split("positional arguments:", 1)[-1].split("options:", 1)[0]
    return re.findall(r"^    ([a-z][a-z-]*)\s", section, flags=re.M)


def _bare_env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}


def check(dockerfile: Path, service: str, work: Path) -> str:
    if service not in SERVICES:
        raise CheckError(f"unknown service {service!r}")
    stage = build_stage(dockerfile, service)
    for flag in ("--frozen", "--no-dev"):
        if flag not in stage.run:
            raise CheckError(f"{dockerfile}: `uv sync` must use {flag}")
    shutil.rmtree(work, ignore_errors=True)
    workdir = make_context(ROOT, work / "context", stage)
    venv = work / "venv"
    env = {**os.environ, **stage.env, "UV_PROJECT_ENVIRONMENT": str(venv)}
    env.pop("VIRTUAL_ENV", None)
    uv = os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools/uv/bin/uv")
    command = [uv if stage.run[0] == "uv" else stage.run[0], *stage.run[1:]]
    subprocess.run(command, cwd=workdir, env=env, check=True)  # noqa: S603 - the Dockerfile's RUN
    # The context is gone from here on: the environment must stand on its own.
    shutil.rmtree(work / "context")
    script = venv / "bin" / service
    if not script.exists():
        raise CheckError(f"no console script {script}")
    commands = _commands(script)
    if not commands:
        raise CheckError(f"{service} --help lists no commands")
    for name in commands:
        subprocess.run(  # noqa: S603 - the console script this check installed
            [str(script), name, "--help"],
            capture_output=True,
            check=True,
            cwd="/",
            env=_bare_env(),
        )
    # What an operator asks a pod first: its build, the revision from the image's ENV.
    shown = subprocess.run(  # noqa: S603 - the console script this check installed
        [str(script), "--version"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env=_bare_env() | {"PIN_BUILD_REVISION": "0123abc"},
    ).stdout
    if not re.match(rf"{service} \d+\.\d+\.\d+ \(revision 0123abc, pin-contracts \d", shown):
        raise CheckError(f"{service} --version says {shown.strip()!r}")
    site = next((venv / "lib").glob("python3*/site-packages"))
    present = {p.name.split("-")[0].lower() for p in site.iterdir()}
    other = {module for name, module in SERVICES.items() if name != service}
    unwanted = sorted(present & {*FORBIDDEN, *other})
    if unwanted:
        raise CheckError(f"{service}: the image environment holds {unwanted}")
    editable = sorted(p.name for p in site.glob("*.pth") if "_editable_" in p.name)
    if editable:
        raise CheckError(f"{service}: editable installs {editable} need the source tree")
    return (
        f"{service}: `{' '.join(stage.run)}` ok; --help of {', '.join(commands)} ok;"
        f" --version {shown.strip()!r}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 3:  # noqa: PLR2004 - DOCKERFILE, SERVICE and WORK_DIR
        sys.stderr.write(__doc__ or "")
        return 2
    try:
        result = check(Path(argv[0]).resolve(), argv[1], Path(argv[2]).resolve())
        sys.stdout.write(result + "\n")
    except (CheckError, subprocess.CalledProcessError) as exc:
        sys.stderr.write(f"image install check failed: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
