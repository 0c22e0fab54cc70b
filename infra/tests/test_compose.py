"""The compose stack and the charts agree (infra/checks/compose_env.py), and the check fails
when a variable, an argument or the hardening exists on one side only."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from pin_contracts.topics import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "infra" / "compose" / "docker-compose.yml"


def load_check() -> ModuleType:
    """infra/checks/compose_env.py, a script rather than a package's module."""
    path = ROOT / "infra" / "checks" / "compose_env.py"
    spec = importlib.util.spec_from_file_location("compose_env_check", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def edited(tmp_path: Path, service: str, key: str, value: object) -> Path:
    """A copy of the compose file (anchors resolved) with one key of one service changed."""
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    doc["services"][service][key] = value
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return copy


def test_the_compose_file_runs_what_the_charts_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_check().main([]) == 0, capsys.readouterr().err


def test_a_variable_only_the_chart_sets_fails(capsys: pytest.CaptureFixture[str]) -> None:
    setting = ["--set", "rewards-membership:extraEnv[0].name=REWARDS_MEMBERSHIP_SOMETHING_NEW"]
    setting += ["--set", "rewards-membership:extraEnv[0].value=x"]
    assert load_check().main(setting) == 1
    assert "rewards-consumer: lacks REWARDS_MEMBERSHIP_SOMETHING_NEW" in capsys.readouterr().err


def test_a_variable_only_compose_sets_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    env = {**doc["services"]["identity-relay"]["environment"], "IDENTITY_FANOUT_EXTRA": "1"}
    copy = edited(tmp_path, "identity-relay", "environment", env)
    assert load_check().main(["--compose", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "identity-relay: sets IDENTITY_FANOUT_EXTRA" in err


def test_other_arguments_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = edited(tmp_path, "identity-worker-2", "command", ["worker"])
    assert load_check().main(["--compose", str(copy)]) == 1
    assert "identity-worker-2: command ['worker'] != chart args" in capsys.readouterr().err


def test_a_writable_root_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = edited(tmp_path, "rewards-consumer", "read_only", False)
    assert load_check().main(["--compose", str(copy)]) == 1
    assert "rewards-consumer: must run read-only" in capsys.readouterr().err


def test_the_stack_creates_the_catalogues_topics_as_the_catalogue_declares_them() -> None:
    """The kafka-topics job's list is written by hand beside `pin_contracts.topics`: every
    topic of the catalogue, its partitions and `max.message.bytes`, and nothing else."""
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    [script] = doc["services"]["kafka-topics"]["command"]
    listed = re.search(r"for t in (.*?); do", script, re.DOTALL)
    partitions = re.search(r"--partitions (\d+)", script)
    assert listed is not None
    assert partitions is not None
    created = dict(item.split(":") for item in listed.group(1).replace("\\", " ").split())
    assert created == {t.name: str(t.max_message_bytes) for t in CATALOGUE}
    assert {t.partitions for t in CATALOGUE} == {int(partitions.group(1))}
