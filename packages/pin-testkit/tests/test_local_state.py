"""Pure parts of the local launcher: ports, the state file, the cluster id."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from pin_testkit.local import LocalInfraError
from pin_testkit.local.state import (
    KAFKA_CONTROLLER_PORT_ENV,
    KAFKA_PORT_ENV,
    PG_PORT_ENV,
    LocalState,
    env_port,
    load_state,
    new_cluster_id,
    pick_port,
    plan_state,
    port_is_free,
    save_state,
    with_secure_ports,
)


def test_pick_port_skips_taken_and_busy_ports() -> None:
    busy = {20001, 20002}
    port = pick_port({20000}, is_free=lambda p: p not in busy, port_range=(20000, 20003))
    assert port == 20003


def test_pick_port_gives_up_with_a_clear_error() -> None:
    with pytest.raises(LocalInfraError, match="no free loopback port"):
        pick_port(set(), is_free=lambda _: False, port_range=(20000, 20001), attempts=5)


def test_picked_port_is_really_free() -> None:
    port = pick_port(set())
    assert 20000 <= port <= 32767
    assert port_is_free(port)


def test_fresh_plan_picks_three_distinct_ports_and_a_cluster_id() -> None:
    state = plan_state(None, environ={})
    ports = {state.pg_port, state.kafka_port, state.kafka_controller_port}
    assert len(ports) == 3
    assert len(state.kafka_cluster_id) == 22


def test_environment_ports_win_on_a_fresh_plan() -> None:
    env = {PG_PORT_ENV: "25432", KAFKA_PORT_ENV: "29092", KAFKA_CONTROLLER_PORT_ENV: "29093"}
    state = plan_state(None, environ=env, is_free=lambda _: True)
    assert (state.pg_port, state.kafka_port, state.kafka_controller_port) == (25432, 29092, 29093)


def test_previous_ports_and_cluster_id_are_kept() -> None:
    previous = LocalState(
        pg_port=21000, kafka_port=21001, kafka_controller_port=21002, kafka_cluster_id="abc"
    )
    assert plan_state(previous, environ={}, is_free=lambda _: False) == previous


def test_broker_and_postgres_ports_may_move_but_not_the_controller_port() -> None:
    previous = LocalState(
        pg_port=21000, kafka_port=21001, kafka_controller_port=21002, kafka_cluster_id="abc"
    )
    moved = plan_state(previous, environ={PG_PORT_ENV: "22000", KAFKA_PORT_ENV: "22001"})
    assert (moved.pg_port, moved.kafka_port) == (22000, 22001)
    assert moved.kafka_cluster_id == "abc"
    with pytest.raises(LocalInfraError, match="controller port 21002"):
        plan_state(previous, environ={KAFKA_CONTROLLER_PORT_ENV: "22002"})


def test_equal_ports_are_refused() -> None:
    env = {PG_PORT_ENV: "25000", KAFKA_PORT_ENV: "25000", KAFKA_CONTROLLER_PORT_ENV: "25001"}
    with pytest.raises(LocalInfraError, match="ports must differ"):
        plan_state(None, environ=env)


@pytest.mark.parametrize("raw", ["abc", "0", "70000", "-1"])
def test_bad_port_variables_are_named(raw: str) -> None:
    with pytest.raises(LocalInfraError, match=PG_PORT_ENV):
        env_port(PG_PORT_ENV, {PG_PORT_ENV: raw})


def test_blank_port_variable_means_unset() -> None:
    assert env_port(PG_PORT_ENV, {PG_PORT_ENV: "  "}) is None


def test_state_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "state.json"
    assert load_state(path) is None
    state = LocalState(
        pg_port=21000, kafka_port=21001, kafka_controller_port=21002, kafka_cluster_id="xyz"
    )
    save_state(path, state)
    assert load_state(path) == state
    assert not list(path.parent.glob(".*.tmp"))


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 99}',
        "not JSON at all",
        '["a list"]',
        '{"version": 1, "pg_port": 1}',
        '{"version": 1, "pg_port": true, "kafka_port": 2, "kafka_controller_port": 3, '
        '"kafka_cluster_id": "x"}',
    ],
)
def test_corrupt_state_files_are_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LocalInfraError):
        load_state(path)


def test_cluster_id_is_kafka_shaped() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cluster_id in ids:
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_secure_ports_are_added_once_and_kept(tmp_path: Path) -> None:
    plain = LocalState(
        pg_port=21000, kafka_port=21001, kafka_controller_port=21002, kafka_cluster_id="xyz"
    )
    assert not plain.secure
    secure = with_secure_ports(plain, is_free=lambda _port: True)
    assert secure.secure
    ports = {secure.kafka_sasl_port, secure.kafka_ssl_port}
    assert len(ports) == 2
    assert not ports & {21000, 21001, 21002}
    assert with_secure_ports(secure) == secure  # kept, not picked again
    path = tmp_path / "state.json"
    save_state(path, secure)
    assert load_state(path) == secure
    # A state file written before secure mode existed reads as not secure.
    path.write_text(plain.to_json().replace('"kafka_sasl_port": null,', ""), encoding="utf-8")
    assert load_state(path) == plain
    # A plain plan keeps the secure ports of the previous state.
    assert plan_state(secure, environ={}) == secure
