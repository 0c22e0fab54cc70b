"""pin-contracts through a real package index: built, published with ``uv publish``, installed
from that index alone into a clean virtual environment, and used there to decode both events.

The index is pypiserver on a loopback port; uploads need credentials. msgspec (the only
dependency) is uploaded to it too, so the installation reads no other index. Needs ``uv``
(``$UV``, on PATH, or the repository's ``.tools/uv``) and, once per run, PyPI to download the
msgspec wheel that goes onto the local index.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pin_contracts import (
    AgentMembershipChanged,
    Envelope,
    UserAccessChangedKafkaEvent,
    encode,
)
from pin_testkit.ports import free_port
from pin_testkit.waiting import ConditionTimeoutError, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "contracts"
SERVER = Path(__file__).with_name("index_server.py")
USER, PASSWORD = "pin-release", "index-secret"
VERSION = tomllib.loads((CONTRACTS / "pyproject.toml").read_text())["project"]["version"]


def uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools/uv/bin/uv")
    if not Path(found).is_file():
        pytest.fail("uv not found: set UV, put uv on PATH, or run `make sync`", pytrace=False)
    return found


def run(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    # No user or project configuration: only the indexes named on the command line count.
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")} | {"UV_NO_CONFIG": "1"}
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300
    )
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done


@dataclass(frozen=True)
class Index:
    url: str  # http://127.0.0.1:PORT/
    packages: Path

    @property
    def simple(self) -> str:
        return self.url + "simple/"

    def publish(self, *files: Path, user: str = USER, password: str = PASSWORD) -> str:
        done = run(
            uv(), "publish", "--publish-url", self.url, "--username", user,
            "--password", password, *map(str, files), cwd=files[0].parent, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise PublishRefusedError(done.stdout + done.stderr)
        return done.stdout + done.stderr


class PublishRefusedError(Exception):
    """`uv publish` failed; the message is its output."""


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    packages = tmp_path_factory.mktemp("index")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), str(packages), str(port)],
        env={**os.environ, "PIN_INDEX_USER": USER, "PIN_INDEX_PASSWORD": PASSWORD},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"

    def answers() -> bool:
        if server.poll() is not None:  # exited: no point waiting out the deadline
            return True
        try:
            with urllib.request.urlopen(url + "health", timeout=1) as response:  # noqa: S310
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        try:
            wait_until(answers, 30, "the package index answers /health", interval=0.1)
        except ConditionTimeoutError:
            server.kill()
        if server.poll() is not None:
            _, err = server.communicate()
            pytest.fail(f"the package index did not start:\n{err}")
        yield Index(url, packages)
    finally:
        server.terminate()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    run(uv(), "build", "--package", "pin-contracts", "--out-dir", str(out), cwd=ROOT)
    wheel = out / f"pin_contracts-{VERSION}-py3-none-any.whl"
    sdist = out / f"pin_contracts-{VERSION}.tar.gz"
    assert wheel.is_file(), sorted(p.name for p in out.iterdir())
    assert sdist.is_file(), sorted(p.name for p in out.iterdir())
    return wheel, sdist


def _dependency_wheels(target: Path) -> list[Path]:
    """The wheel of every dependency of pin-contracts, at the version this workspace locks."""
    target.mkdir(parents=True, exist_ok=True)
    version = importlib.metadata.version("msgspec")
    run(
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--dest", str(target), f"msgspec=={version}", cwd=target,
    )  # fmt: skip
    return sorted(target.glob("*.whl"))


DECODE = """
import importlib.metadata, json, sys
import msgspec, pin_contracts
values = json.loads(sys.stdin.read())
access = pin_contracts.decode_access_changed(values["access"].encode())
membership = pin_contracts.decode_membership_changed(values["membership"].encode())
dist = importlib.metadata.distribution("pin-contracts")
print(json.dumps({
    "module": pin_contracts.__file__,
    "version": dist.version,
    "direct_url": dist.read_text("direct_url.json"),
    "access": msgspec.json.decode(pin_contracts.encode(access)),
    "membership": msgspec.json.decode(pin_contracts.encode(membership)),
}))
"""


def test_published_contracts_install_from_the_index_alone_and_decode_both_events(
    index: Index,
    dist: tuple[Path, Path],
    tmp_path: Path,
    access_envelope: Envelope[UserAccessChangedKafkaEvent],
    membership_envelope: Envelope[AgentMembershipChanged],
) -> None:
    wheel, sdist = dist
    # Uploads need the index's credentials.
    with pytest.raises(PublishRefusedError, match=r"403|401|[Ff]orbidden|[Uu]nauthori"):
        index.publish(wheel, sdist, password="not-the-password")
    assert not any(index.packages.iterdir())
    index.publish(wheel, sdist)
    index.publish(*_dependency_wheels(tmp_path / "deps"))
    with urllib.request.urlopen(index.simple + "pin-contracts/", timeout=10) as page:  # noqa: S310
        listing = page.read().decode()
    assert wheel.name in listing
    assert sdist.name in listing

    venv = tmp_path / "venv"
    run(uv(), "venv", "--quiet", "--python", sys.executable, str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    installed = run(
        uv(), "pip", "install", "--python", str(python), "--no-cache",
        "--index-url", index.simple, "pin-contracts", cwd=tmp_path,
    )  # fmt: skip
    assert f"pin-contracts=={VERSION}" in installed.stderr + installed.stdout

    records = {"access": encode(access_envelope), "membership": encode(membership_envelope)}
    values = {name: value.decode() for name, value in records.items()}
    done = subprocess.run(
        [str(python), "-I", "-c", DECODE],
        input=json.dumps(values),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert Path(seen["module"]).is_relative_to(venv)  # not the workspace's source
    assert seen["version"] == VERSION
    assert seen["direct_url"] is None  # installed from an index, not from a file or URL
    # Decoded there and encoded again: the same records as the workspace's own code makes.
    for name, value in records.items():
        assert seen[name] == json.loads(value), name
    assert seen["access"]["EventType"] == "UserAccessChanged"
    assert seen["membership"]["EventType"] == "AgentMembershipChanged"


def test_a_published_version_is_final_on_the_index(index: Index, dist: tuple[Path, Path]) -> None:
    """The index refuses new files under a released version, as the release rule refuses a
    schema change without a new version (contracts/tests/test_release.py)."""
    wheel, _ = dist
    with contextlib.suppress(PublishRefusedError):  # the test above may have published it
        index.publish(wheel)
    with pytest.raises(PublishRefusedError, match=r"409|[Cc]onflict|exists"):
        index.publish(wheel)
