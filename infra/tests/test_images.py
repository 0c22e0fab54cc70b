"""The images are built with the build's facts (infra/docker/build-args.sh): git's revision,
the service's package version and the repository, so an image never says `revision unknown`.
No Docker engine: the script runs in a throwaway git repository holding the workspace's
project files, and every place that builds an image is checked to pass its output."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from pin_runtime.build import REVISION_ENV

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path("infra") / "docker" / "build-args.sh"
SERVICES = sorted(path.name for path in (ROOT / "services").iterdir() if path.is_dir())
ORIGIN = "https://git.example.com/pin/pin-workers.git"


def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    return found or str(ROOT / ".tools" / "uv" / "bin" / "uv")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with the script, the tools it sources and the uv workspace's project
    files (what `uv version --package` reads), committed."""
    repo = tmp_path / "repo"
    files = [SCRIPT, Path("infra/checks/tools.sh"), Path("pyproject.toml"), Path("uv.lock")]
    for members in ("contracts", "packages/*", "services/*"):  # the workspace's
        files += [p.relative_to(ROOT) for p in ROOT.glob(f"{members}/pyproject.toml")]
    for file in files:
        (repo / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / file, repo / file)
    git(repo.parent, "init", "--quiet", str(repo))
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", "x")
    return repo


def build_args(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "UV": uv()},
    )


def facts(repo: Path, service: str) -> dict[str, str]:
    done = build_args(repo, service)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(line.startswith("--build-arg=") for line in lines), lines
    return dict(line.removeprefix("--build-arg=").split("=", 1) for line in lines)


@pytest.mark.parametrize("service", SERVICES)
def test_the_build_args_are_the_revision_the_version_and_the_source(
    repo: Path, service: str
) -> None:
    project = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())
    head = git(repo, "rev-parse", "HEAD")
    # No remote: the checkout itself.
    assert facts(repo, service) == {
        "SOURCE": f"file://{repo}",
        "REVISION": head,
        "VERSION": project["project"]["version"],
    }
    git(repo, "remote", "add", "origin", ORIGIN)
    assert facts(repo, service)["SOURCE"] == ORIGIN
    # An untracked file leaves the build clean; an uncommitted change to a tracked one not.
    (repo / "notes.txt").write_text("scratch")
    assert facts(repo, service)["REVISION"] == head
    with (repo / "pyproject.toml").open("a") as edit:
        edit.write("\n# edited\n")
    assert facts(repo, service)["REVISION"] == f"{head}-dirty"


@pytest.mark.parametrize("args", [(), ("no-such-service",), ("",), ("a", "b")])
def test_a_wrong_service_is_refused(repo: Path, args: tuple[str, ...]) -> None:
    done = build_args(repo, *args)
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert not done.stdout


def test_every_image_build_passes_the_build_args() -> None:
    """images.sh (`make images`), the Deploy steps of infra/README.md and the Dockerfile's own
    example: every `docker build` of a service target passes the script's arguments."""
    images = (ROOT / "infra" / "docker" / "images.sh").read_text()
    assert re.search(r'mapfile -t facts < <\(UV="\$UV" "\$HERE/build-args\.sh" "\$svc"\)', images)
    start = images.index('"$DOCKER" build --network host --quiet "${args[@]}"')
    service_build = images[start : images.index(">/dev/null", start)]
    assert '"${facts[@]}"' in service_build
    assert '--target "$svc"' in service_build
    for doc in (ROOT / "infra" / "README.md", ROOT / "infra" / "docker" / "Dockerfile"):
        text = doc.read_text()
        # A command and its continuation lines (ending in a backslash).
        builds = re.findall(r"docker build (?:[^\n]*\\\n)*[^\n]*", text)
        service_builds = [b for b in builds if "--target" in b]
        assert service_builds, doc
        for build in service_builds:
            assert "build-args.sh" in build, (doc, build)


def test_the_dockerfile_turns_the_build_args_into_labels_and_the_runtime_revision() -> None:
    dockerfile = (ROOT / "infra" / "docker" / "Dockerfile").read_text()
    for argument in ("SOURCE", "REVISION", "VERSION"):
        assert re.search(rf"^ARG {argument}=unknown$", dockerfile, re.MULTILINE), argument
    assert 'org.opencontainers.image.revision="${REVISION}"' in dockerfile
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile
    # What pin_runtime.build reads for `--version`, *_build_info and the spans.
    assert f'{REVISION_ENV}="${{REVISION}}"' in dockerfile
