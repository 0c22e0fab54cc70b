"""Fixtures of the pin-runtime tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pin_runtime.kafka import ConfigValue, create_producer

UnreachableProducer = Callable[[Mapping[str, ConfigValue]], Producer]
ImportablePackage = Callable[[str, Mapping[str, str]], None]


@pytest.fixture
def unreachable_producer() -> UnreachableProducer:
    """`unreachable_producer(config)`: a producer (client id ``p``) of a broker that never
    answers (port 1 of the loopback): a record stays queued until its ``message.timeout.ms``
    runs out, then fails with _MSG_TIMED_OUT; ``produce()`` checks still apply at once."""

    def make(config: Mapping[str, ConfigValue]) -> Producer:
        return create_producer("127.0.0.1:1", client_id="p", extra=config)

    return make


@pytest.fixture
def migrations_dir(tmp_path: Path) -> Callable[[Mapping[str, str]], Path]:
    """`migrations_dir(files)`: the test's migrations directory with ``files`` (name -> SQL)
    written into it, next to what earlier calls wrote (a release adding a file); its path."""
    directory = tmp_path / "m"

    def write(files: Mapping[str, str]) -> Path:
        directory.mkdir(exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
        return directory

    return write


@pytest.fixture
def importable_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ImportablePackage:
    """`importable_package(name, files)`: a package `name` importable for the test, holding
    ``files`` (a path with ``/`` -> its text): what `importlib.resources` reads data from."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(name: str, files: Mapping[str, str]) -> None:
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text("")
        for path, text in files.items():
            target = package.joinpath(*path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")

    return make
