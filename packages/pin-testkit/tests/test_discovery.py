"""The order in which services are found, without starting any."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pin_testkit.discovery import ServiceUnavailableError, discover, docker_engine_answers


def test_environment_variables_win() -> None:
    cleanups: list[Callable[[], Any]] = []
    services = discover(
        {"PIN_POSTGRES_DSN": "postgresql://u@h:1/postgres", "PIN_KAFKA_BOOTSTRAP": "h:2"},
        cleanups,
    )
    assert services.postgres_dsn == "postgresql://u@h:1/postgres"
    assert services.kafka_bootstrap == "h:2"
    assert services.source == "environment"
    assert cleanups == []


@pytest.mark.parametrize(
    ("environ", "missing"),
    [
        ({"PIN_POSTGRES_DSN": "postgresql://u@h:1/postgres"}, "PIN_KAFKA_BOOTSTRAP"),
        ({"PIN_KAFKA_BOOTSTRAP": "h:2"}, "PIN_POSTGRES_DSN"),
    ],
)
def test_half_configured_environment_is_an_error(environ: dict[str, str], missing: str) -> None:
    # Falling back to another source here would test against a server nobody asked for.
    with pytest.raises(ServiceUnavailableError, match=missing):
        discover(environ, [])


def test_no_docker_engine_is_a_plain_no(tmp_path: Path) -> None:
    missing_socket = tmp_path / "docker.sock"
    assert not docker_engine_answers({"DOCKER_HOST": f"unix://{missing_socket}"})
    assert not docker_engine_answers({"DOCKER_HOST": "tcp://127.0.0.1:1"})
