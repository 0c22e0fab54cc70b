"""The JSON state file: ports and the Kafka cluster id, chosen once and kept."""

from __future__ import annotations

import base64
import os
import secrets
import socket
import uuid
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.procs import write_atomic

STATE_VERSION = 1
PG_PORT_ENV = "PIN_LOCAL_PG_PORT"
KAFKA_PORT_ENV = "PIN_LOCAL_KAFKA_PORT"
KAFKA_CONTROLLER_PORT_ENV = "PIN_LOCAL_KAFKA_CONTROLLER_PORT"
# Picked ports stay below the usual Linux ephemeral range (32768-60999) so that an outgoing
# connection cannot take them between two runs.
PORT_RANGE = (20000, 32767)
_MAX_PORT = 65535
Port = Annotated[int, msgspec.Meta(gt=0, le=_MAX_PORT)]


class LocalState(msgspec.Struct, frozen=True, kw_only=True):
    pg_port: Port
    kafka_port: Port
    kafka_controller_port: Port
    kafka_cluster_id: str
    version: int = STATE_VERSION
    # The secured listeners (`pin-local up --secure`); None until secure mode is first asked
    # for, then kept: a later plain `up` does not take them away.
    kafka_sasl_port: Port | None = None
    kafka_ssl_port: Port | None = None

    @property
    def secure(self) -> bool:
        return self.kafka_sasl_port is not None and self.kafka_ssl_port is not None

    def to_json(self) -> str:
        encoded = msgspec.json.encode(self, order="sorted")
        return msgspec.json.format(encoded, indent=2).decode() + "\n"

    @classmethod
    def from_json(cls, text: str) -> LocalState:
        try:
            raw = msgspec.json.decode(text)
            version = raw.get("version") if isinstance(raw, dict) else None
            if version != STATE_VERSION:
                raise LocalInfraError(f"unsupported state file (version {version!r})")
            return msgspec.convert(raw, cls)
        except msgspec.MsgspecError as exc:
            raise LocalInfraError(f"corrupt state file: {exc}") from exc


def load_state(path: Path) -> LocalState | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return LocalState.from_json(text)


def save_state(path: Path, state: LocalState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, state.to_json())


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (as Uuid.toString)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):  # Kafka's own generator rejects these too
            return text


def port_is_free(port: int) -> bool:
    """Whether a listening socket can be bound to 127.0.0.1:``port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(
    taken: Collection[int],
    is_free: Callable[[int], bool] = port_is_free,
    port_range: tuple[int, int] = PORT_RANGE,
    attempts: int = 200,
) -> int:
    """A random free loopback port in ``port_range`` that is not in ``taken``."""
    low, high = port_range
    for _ in range(attempts):
        port = low + secrets.randbelow(high - low + 1)
        if port not in taken and is_free(port):
            return port
    raise LocalInfraError(f"no free loopback port in {low}-{high} after {attempts} attempts")


def env_port(name: str, environ: Mapping[str, str]) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return msgspec.convert(raw, Port, strict=False)
    except msgspec.ValidationError:
        raise LocalInfraError(f"{name}={raw!r} is not a TCP port") from None


def plan_state(
    previous: LocalState | None,
    environ: Mapping[str, str] | None = None,
    is_free: Callable[[int], bool] = port_is_free,
) -> LocalState:
    """The state to run with: environment overrides, else the previous ports, else fresh ones.

    The controller port is part of the KRaft voter set written when the storage is formatted,
    so it cannot change once chosen; the other two may.
    """
    env = os.environ if environ is None else environ
    pg = env_port(PG_PORT_ENV, env)
    kafka = env_port(KAFKA_PORT_ENV, env)
    controller = env_port(KAFKA_CONTROLLER_PORT_ENV, env)
    if previous is not None:
        if controller is not None and controller != previous.kafka_controller_port:
            raise LocalInfraError(
                f"{KAFKA_CONTROLLER_PORT_ENV}={controller} but the Kafka storage was formatted "
                f"with controller port {previous.kafka_controller_port}: unset it, or run "
                "`pin-local down` and delete the state directory"
            )
        return msgspec.structs.replace(
            previous,
            pg_port=pg or previous.pg_port,
            kafka_port=kafka or previous.kafka_port,
        )
    taken: set[int] = {p for p in (pg, kafka, controller) if p is not None}
    if pg is None:
        pg = pick_port(taken, is_free)
        taken.add(pg)
    if kafka is None:
        kafka = pick_port(taken, is_free)
        taken.add(kafka)
    if controller is None:
        controller = pick_port(taken, is_free)
    if len({pg, kafka, controller}) != 3:  # noqa: PLR2004 - three distinct ports
        raise LocalInfraError(f"ports must differ: pg={pg} kafka={kafka} controller={controller}")
    return LocalState(
        pg_port=pg,
        kafka_port=kafka,
        kafka_controller_port=controller,
        kafka_cluster_id=new_cluster_id(),
    )


def with_secure_ports(
    state: LocalState, is_free: Callable[[int], bool] = port_is_free
) -> LocalState:
    """``state`` with ports for the secured listeners (the kept ones, else new ones)."""
    if state.secure:
        return state
    taken = {state.pg_port, state.kafka_port, state.kafka_controller_port}
    sasl = pick_port(taken, is_free)
    ssl = pick_port({*taken, sasl}, is_free)
    return msgspec.structs.replace(state, kafka_sasl_port=sasl, kafka_ssl_port=ssl)
