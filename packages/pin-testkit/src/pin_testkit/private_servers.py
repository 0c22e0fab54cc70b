"""PostgreSQL and Kafka of one test session alone, which it may stop and start again.

The launcher's default pair (``pin-local up``) is shared by every suite of a run, so a suite
that stops a server (the end-to-end suite's outage scenarios) runs a second pair in a fresh
temporary state directory: ``pin_testkit.local.ensure_up(state_dir=...)``. Starting a stopped
server again is ``ensure_up`` once more: it reuses what answers and restarts what does not,
on the same ports with the same data.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Self

from pin_testkit.local import LocalServices, down, ensure_up
from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.kafka import Kafka, ensure_libs, libs_current
from pin_testkit.local.layout import Layout, resolve_layout
from pin_testkit.local.postgres import Postgres, find_bindir, server_account
from pin_testkit.local.procs import file_lock
from pin_testkit.local.state import (
    KAFKA_CONTROLLER_PORT_ENV,
    KAFKA_PORT_ENV,
    PG_PORT_ENV,
    LocalState,
    load_state,
)

__all__ = ["PrivateServers", "share_broker_files"]

log = logging.getLogger(__name__)

STATE_PREFIX: Final = "pin-private-servers-"
START_TIMEOUT: Final = 240.0
LIBS_LOCK_TIMEOUT: Final = 1800.0  # a first Maven copy of the broker's jars may take minutes


class PrivateServers:
    """A PostgreSQL + Kafka pair in a state directory of its own: ``services`` (DSN and
    bootstrap), ``stop_kafka()``, ``stop_postgres()``, ``restart_stopped()``, ``close()``.

    ``PrivateServers.launch()`` starts one; use it as a context manager (or call ``close()``)
    so that both servers are stopped and the directory removed whatever happened.
    """

    def __init__(self, services: LocalServices, state_dir: Path) -> None:
        self.services = services
        self.state_dir = state_dir
        self.layout = Layout(repo_root=resolve_layout().repo_root, state_dir=state_dir)
        self.stopped: set[str] = set()  # servers stopped and not started again

    @classmethod
    def launch(cls, *, prefix: str = STATE_PREFIX) -> Self:
        """Both servers started and answering in a new ``<tmp>/<prefix>*`` directory."""
        state_dir = Path(tempfile.mkdtemp(prefix=prefix))
        state_dir.chmod(0o755)  # as root, PostgreSQL runs as `postgres`, which must enter it
        try:
            share_broker_files(state_dir)
            services = _ensure_up(state_dir)
        except BaseException:
            _stop_and_remove(state_dir)
            raise
        return cls(services, state_dir)

    def close(self) -> None:
        """Stop both servers and delete their state directory."""
        _stop_and_remove(self.state_dir)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- faults -------------------------------------------------------------------------------

    def stop_kafka(self) -> float:
        """A clean broker shutdown (SIGTERM); the seconds it took."""
        started = time.monotonic()
        state = self._state()
        kafka = Kafka(
            self.layout, state.kafka_port, state.kafka_controller_port, state.kafka_cluster_id
        )
        self.stopped.add("kafka")
        if not kafka.stop():
            raise LocalInfraError(f"the broker of {self.state_dir} was not running")
        return time.monotonic() - started

    def stop_postgres(self, *, mode: str = "fast") -> float:
        """``pg_ctl stop -m fast`` (or ``immediate``: a crash, recovery at the next start):
        every session is terminated; the seconds it took."""
        started = time.monotonic()
        state = self._state()
        self.stopped.add("postgres")
        stopped = Postgres(self.layout, state.pg_port).stop(
            find_bindir(), server_account(), mode=mode
        )
        if not stopped:
            raise LocalInfraError(f"the PostgreSQL of {self.state_dir} was not running")
        return time.monotonic() - started

    def restart_stopped(self) -> float:
        """Start whatever is stopped, on its old ports with its old data; the seconds it took."""
        started = time.monotonic()
        again = _ensure_up(self.state_dir)
        self.stopped.clear()
        if (again.kafka_bootstrap, again.postgres_dsn) != (
            self.services.kafka_bootstrap,
            self.services.postgres_dsn,
        ):
            raise LocalInfraError(f"the servers of {self.state_dir} came back on other ports")
        return time.monotonic() - started

    def _state(self) -> LocalState:
        state = load_state(self.layout.state_file)
        if state is None:
            raise LocalInfraError(f"no server state in {self.state_dir}")
        return state


@contextlib.contextmanager
def _own_ports() -> Iterator[None]:
    """Hide PIN_LOCAL_*_PORT: they pin the shared servers' ports, never a private pair's."""
    names = (PG_PORT_ENV, KAFKA_PORT_ENV, KAFKA_CONTROLLER_PORT_ENV)
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _ensure_up(state_dir: Path) -> LocalServices:
    with _own_ports():
        return ensure_up(state_dir=state_dir, timeout=START_TIMEOUT)


def share_broker_files(state_dir: Path) -> None:
    """Link the launcher's broker jars and class-data archive into ``state_dir``.

    Without this, ``ensure_up`` on a fresh state directory runs Maven for the jars, and the
    broker's first stop writes a 50 MB class-data archive (seconds, during an outage test).
    """
    shared = resolve_layout()
    if not libs_current(shared):
        with file_lock(shared.lock_file, LIBS_LOCK_TIMEOUT):
            ensure_libs(shared)
    kafka_dir = state_dir / "kafka"
    kafka_dir.mkdir()
    (kafka_dir / "libs").symlink_to(shared.kafka_libs, target_is_directory=True)
    for archive in shared.kafka_dir.glob("cds-*.jsa"):
        (kafka_dir / archive.name).symlink_to(archive)


def _stop_and_remove(state_dir: Path) -> None:
    try:
        down(state_dir=state_dir)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
