"""The outbox protocol's model checks: outbox.pml run through spin, one run per design and
property, each against what it must give (README.md beside this file).

The frontier must pass every property; the back-read protocol it replaced must fail G2 (the
per-key order) and, when the relay's login lacks pg_read_all_stats, floor safety and G1
(a row stuck); each variant of the frontier with one of its rules taken away must fail G2.
A check that gives anything else fails the run, so a model that stopped finding the
back-read protocol's bug is noticed as surely as a new design that breaks a property.

    python3 check.py             # every check, a summary per check (states, time)
    python3 check.py --quick     # the checks that decide (not the back-read ones with the grant)
    python3 check.py --trails D  # also write each counterexample's steps to D/<check>.txt

Needs spin and gcc on the PATH (run.sh installs them).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MODEL: Final = Path(__file__).with_name("outbox.pml")

PAN_FLAGS: Final = ("-w", "-O1", "-DMEMLIM=4096")
"""gcc flags of every verifier: pan.c's own warnings silenced, a 4 GiB ceiling."""
DEPTH: Final = "-m200000"
HASH: Final = "-w24"


@dataclass(frozen=True)
class Check:
    name: str
    design: str
    prop: str
    defines: tuple[str, ...]
    liveness: bool
    must_pass: bool
    quick: bool = True
    """Part of `--quick` (the test's run): everything that decides; the rest documents."""


FRONTIER = "frontier"
BACKREAD = "back-read"
NOSTATS = "back-read, no pg_read_all_stats"
G2 = "G2 order"
FLOOR = "floor safety"
G1 = "G1 no row stuck"

CHECKS: Final = (
    Check("frontier-order", FRONTIER, G2, ("-DFRONTIER", "-DCHECK_ORDER"), False, True),
    Check("frontier-floor", FRONTIER, FLOOR, ("-DFRONTIER", "-DCHECK_FLOOR"), False, True),
    Check("frontier-g1", FRONTIER, G1, ("-DFRONTIER",), True, True),
    Check(
        "frontier-limit1-order",
        "frontier, LIMIT 1",
        G2,
        ("-DFRONTIER", "-DCHECK_ORDER", "-DLIMIT=1"),
        False,
        True,
        quick=False,
    ),
    Check("backread-order", BACKREAD, G2, ("-DBACKREAD", "-DCHECK_ORDER"), False, False),
    Check(
        "backread-floor", BACKREAD, FLOOR, ("-DBACKREAD", "-DCHECK_FLOOR"), False, True, quick=False
    ),
    Check("backread-g1", BACKREAD, G1, ("-DBACKREAD",), True, True, quick=False),
    Check(
        "backread-nostats-floor",
        NOSTATS,
        FLOOR,
        ("-DBACKREAD", "-DNOSTATS", "-DCHECK_FLOOR"),
        False,
        False,
    ),
    Check("backread-nostats-g1", NOSTATS, G1, ("-DBACKREAD", "-DNOSTATS"), True, False),
    Check(
        "frontier-holders-first",
        "frontier, holders read before the last id",
        G2,
        ("-DFRONTIER", "-DCHECK_ORDER", "-DHOLDERS_FIRST"),
        False,
        False,
    ),
    Check(
        "frontier-id-before-lock",
        "frontier, id taken before the writer lock",
        G2,
        ("-DFRONTIER", "-DCHECK_ORDER", "-DID_BEFORE_LOCK"),
        False,
        False,
    ),
    Check(
        "frontier-no-first-wait",
        "frontier, a holder without a first id not waited for",
        G2,
        ("-DFRONTIER", "-DCHECK_ORDER", "-DNO_FIRST_WAIT"),
        False,
        False,
    ),
    Check(
        "frontier-naive-limit",
        "frontier, cursor to H after a LIMIT cut",
        G2,
        ("-DFRONTIER", "-DCHECK_ORDER", "-DNAIVE_LIMIT", "-DLIMIT=1"),
        False,
        False,
    ),
)


@dataclass(frozen=True)
class Outcome:
    check: Check
    errors: int
    kind: str
    states: int
    transitions: int
    seconds: float
    steps: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return self.errors == 0

    @property
    def as_expected(self) -> bool:
        return self.passed == self.check.must_pass


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(
            f"model: {name} not found (services/identity-fanout/model/run.sh installs it)"
        )
    return path


def _run(args: Sequence[str], cwd: Path) -> str:
    done = subprocess.run(  # noqa: S603 - spin, gcc and pan, arguments built here
        args, cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 and not Path(args[0]).name == "pan":
        raise SystemExit(f"model: {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


def _number(pattern: str, text: str) -> float:
    found = re.findall(pattern, text)
    return float(found[-1]) if found else 0.0


_NOISE = re.compile(
    r"^(spin:|#processes|\s*\d+:\s+proc|\s+\S+ = |ltl |Never claim|\d+ processes created|\s*$)"
)


def trail_steps(replay: str) -> tuple[str, ...]:
    """The model's own lines (its printf) along a counterexample, in order: up to the first
    violation, or the steps into the cycle and then the cycle's, with what stays stuck."""
    steps: list[str] = []
    for line in replay.splitlines():
        if "START OF CYCLE" in line:
            steps.append("then, for ever (the cycle):")
            continue
        if _NOISE.match(line):
            continue
        steps.append(line.strip())
        if "violated" in line:
            break
    if steps and steps[-1].startswith("then, for ever"):
        rows = [int(i) for i, v in re.findall(r"\brst\[(\d+)\] = (\d+)", replay) if v == "3"]
        floors = [
            f"R{int(r) + 1}'s floor {v}"
            for r, v in re.findall(r"\bfloor\[(\d)\] = (\d+)", replay)
            if v != "0"
        ]
        steps.append(
            f"the relays go round and round; committed ids {', '.join(map(str, rows))} stay "
            f"in the outbox, never read ({', '.join(floors)})"
        )
    return tuple(steps)


def run_check(check: Check, work: Path) -> Outcome:
    spin, gcc = _tool("spin"), _tool("gcc")
    work.mkdir()
    model = work / MODEL.name
    shutil.copyfile(MODEL, model)
    _run([spin, *check.defines, "-a", model.name], work)
    # G1: acceptance cycles under weak fairness (-f; NFAIR: room for the model's processes).
    verifier = ["-DNFAIR=3"] if check.liveness else ["-DSAFETY", "-DNOCLAIM"]
    _run([gcc, *PAN_FLAGS, *verifier, "-o", "pan", "pan.c"], work)
    # A safety check that must fail looks for its shortest counterexample (-i): it reads best.
    search = ["-a", "-f"] if check.liveness else ([] if check.must_pass else ["-i"])
    started = time.monotonic()
    out = _run([str(work / "pan"), *search, DEPTH, HASH], work)
    seconds = time.monotonic() - started
    errors = int(_number(r"errors: (\d+)", out))
    kind = (
        "acceptance cycle"
        if "acceptance cycle" in out
        else "assertion violated"
        if "assertion violated" in out
        else "none"
    )
    steps: tuple[str, ...] = ()
    if errors:
        steps = trail_steps(_run([spin, *check.defines, "-t", model.name], work))
    return Outcome(
        check,
        errors,
        kind,
        int(_number(r"([\d.e+]+) states, stored", out)),
        int(_number(r"([\d.e+]+) transitions", out)),
        seconds,
        steps,
    )


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def report(outcome: Outcome) -> str:
    c = outcome.check
    result = "pass" if outcome.passed else f"FAIL ({outcome.kind})"
    verdict = "as expected" if outcome.as_expected else "UNEXPECTED"
    return (
        f"{c.name:<24} {c.prop:<16} {result:<30} {verdict:<12} "
        f"{outcome.states:>11,} states {outcome.transitions:>12,} transitions "
        f"{outcome.seconds:6.1f} s\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="only the checks that decide")
    parser.add_argument("--trails", type=Path, help="write each counterexample's steps here")
    parser.add_argument("--only", action="append", help="run only this check (repeatable)")
    args = parser.parse_args(argv)
    chosen = [
        c for c in CHECKS if (not args.quick or c.quick) and (not args.only or c.name in args.only)
    ]
    version = _run([_tool("spin"), "-V"], Path.cwd()).strip()
    _write(f"model: {MODEL.name}, {version}, {len(chosen)} checks\n")
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="pin-model-") as tmp:
        for check in chosen:
            outcome = run_check(check, Path(tmp) / check.name)
            outcomes.append(outcome)
            _write(report(outcome))
    for outcome in outcomes:
        if not outcome.steps:
            continue
        lines = [f"{n}. {step}" for n, step in enumerate(outcome.steps, 1)]
        text = f"{outcome.check.name} ({outcome.check.design}, {outcome.check.prop}):\n"
        text += "".join(f"  {line}\n" for line in lines)
        _write("\n" + text)
        if args.trails:
            args.trails.mkdir(parents=True, exist_ok=True)
            (args.trails / f"{outcome.check.name}.txt").write_text("\n".join(lines) + "\n")
    wrong = [o.check.name for o in outcomes if not o.as_expected]
    total = sum(o.seconds for o in outcomes)
    _write(
        f"\nmodel: {len(outcomes) - len(wrong)} of {len(outcomes)} checks as expected "
        f"({total:.0f} s of search)\n"
    )
    if wrong:
        _write(f"model: UNEXPECTED: {', '.join(wrong)}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
