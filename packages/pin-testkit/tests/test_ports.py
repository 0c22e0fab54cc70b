"""free_port: a loopback port nothing listens on."""

from __future__ import annotations

import socket

from pin_testkit.ports import free_port, listens


def test_free_port_can_be_bound_and_refuses_connections_until_then() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))  # and it can be taken
        server.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_free_ports_differ_while_held() -> None:
    with socket.socket() as held:
        first = free_port()
        held.bind(("127.0.0.1", first))
        assert free_port() != first


def test_listens_sees_a_listening_socket_and_not_a_free_port() -> None:
    port = free_port()
    assert not listens(port)
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert listens(port)
    assert not listens(port)
