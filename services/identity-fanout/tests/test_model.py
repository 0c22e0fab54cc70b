"""The outbox protocol's model (services/identity-fanout/model/README.md), checked by spin.

The deciding checks of `make model` (`check.py --quick`): the frontier passes
G2, floor safety and G1; the back-read protocol it replaced fails G2 with the known per-key
counterexample and, without pg_read_all_stats, floor safety and G1; each variant of the
frontier without one of its rules fails G2. The counterexamples' steps are the README's.

Spin and gcc must be there (`make test` installs them through
`make model-tools`): the test fails without them, it never skips.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parents[1] / "model"
README = MODEL / "README.md"
SHOWN = ("backread-order", "backread-nostats-floor", "backread-nostats-g1")
"""Counterexamples the README shows step by step."""


def _spin_and_gcc() -> None:
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if not missing:
        return
    # `make test` installs them first (make model-tools): missing, the check fails, never skips.
    pytest.fail(f"{' and '.join(missing)} missing: `make model-tools` installs them")


# A guard against a hung verifier, not a speed limit: the deciding checks search about 130 s
# of states with the other core busy.
@pytest.mark.timeout(600)
def test_the_frontier_passes_and_the_old_protocol_fails_as_known(tmp_path: Path) -> None:
    _spin_and_gcc()
    done = subprocess.run(
        [sys.executable, str(MODEL / "check.py"), "--quick", "--trails", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=590,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    per_key = (tmp_path / "backread-order.txt").read_text().splitlines()
    # W1 takes id 1 for A, W3 commits B@2 and it is read (cursor 2), W1 commits below the
    # cursor, W2 (serialised after W1) commits A@3, which is read before A@1.
    assert per_key[-1].endswith(
        "G2 violated: A@3 produced while A@1 is committed and not acknowledged"
    )
    stuck = (tmp_path / "backread-nostats-g1.txt").read_text()
    assert "then, for ever (the cycle):" in stuck
    readme = README.read_text()
    for name in SHOWN:
        steps = (tmp_path / f"{name}.txt").read_text()
        assert steps in readme, f"{name}: the README's steps are not the check's:\n{steps}"
