"""The order in which services are found, without starting any."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pin_testkit.containers import choose_images
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


def test_containers_asked_for_without_an_engine_fail_loudly(tmp_path: Path) -> None:
    # No fall back to pin-local (which may well be running) nor to the environment's
    # addresses: the run asked for containers and must not be green on anything else.
    environ = {
        "PIN_SERVICES": "containers",
        "DOCKER_HOST": f"unix://{tmp_path / 'docker.sock'}",
        "PIN_POSTGRES_DSN": "postgresql://u@h:1/postgres",
        "PIN_KAFKA_BOOTSTRAP": "h:2",
    }
    cleanups: list[Callable[[], Any]] = []
    with pytest.raises(ServiceUnavailableError, match=r"PIN_SERVICES=containers.*no Docker engine"):
        discover(environ, cleanups)
    assert cleanups == []


def test_an_unknown_source_is_an_error() -> None:
    with pytest.raises(ServiceUnavailableError, match=r"PIN_SERVICES='docker'.*containers"):
        discover({"PIN_SERVICES": "docker"}, [])


def test_environment_asked_for_needs_both_addresses() -> None:
    with pytest.raises(ServiceUnavailableError, match="PIN_SERVICES=environment"):
        discover({"PIN_SERVICES": "environment"}, [])


@pytest.mark.parametrize(
    ("environ", "local", "expected"),
    [
        ({}, set(), ("postgres:15", "apache/kafka:4.2.0")),
        (
            {},
            {"pin-base/postgres:15", "pin-base/kafka:4.2.0"},
            ("pin-base/postgres:15", "pin-base/kafka:4.2.0"),
        ),
        (
            {"PIN_POSTGRES_IMAGE": "registry.example/pg:15", "PIN_KAFKA_IMAGE": "k:4"},
            {"pin-base/postgres:15", "pin-base/kafka:4.2.0"},
            ("registry.example/pg:15", "k:4"),
        ),
    ],
)
def test_images_named_then_local_bases_then_public(
    environ: dict[str, str], local: set[str], expected: tuple[str, str]
) -> None:
    assert choose_images(environ, local) == expected
