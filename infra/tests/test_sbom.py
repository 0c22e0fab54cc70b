"""`make sbom` (infra/checks/sbom.sh, sbom.py) writes each image's SBOM wherever it is told
and names the files it wrote: from the repository's root inside the checkout, in full
anywhere else.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "infra" / "checks"


def load_sbom() -> ModuleType:
    """infra/checks/sbom.py, a script rather than a package's module."""
    spec = importlib.util.spec_from_file_location("sbom_check", CHECKS / "sbom.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_out_dir_outside_the_repository_is_written_and_named_in_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sbom = load_sbom()
    out = tmp_path / "sbom"
    assert sbom.main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(sbom.SERVICES)
    for service, line in zip(sbom.SERVICES, lines, strict=True):
        path = out / f"{service}.cdx.json"
        assert path.is_file()
        assert line.startswith(f"sbom: {path.resolve()}: ")
        assert line.endswith(" components match uv.lock")


def test_paths_inside_the_checkout_are_named_from_its_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sbom = load_sbom()
    assert sbom.shown(ROOT / "build" / "sbom" / "a.cdx.json") == "build/sbom/a.cdx.json"
    monkeypatch.chdir(ROOT / "infra")  # a relative path: from the directory it is given in
    assert sbom.shown(Path("out") / "a.cdx.json") == "infra/out/a.cdx.json"
    assert sbom.shown(Path("/elsewhere/a.cdx.json")) == "/elsewhere/a.cdx.json"


def test_the_script_reads_a_relative_out_dir_from_where_it_is_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(CHECKS / "sbom.sh"), "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    written = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert written == sorted(f"{s}.cdx.json" for s in load_sbom().SERVICES)
    assert f"sbom: {(tmp_path / 'out').resolve()}/" in done.stdout
