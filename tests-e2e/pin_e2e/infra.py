"""The e2e suite's own PostgreSQL and Kafka, and the faults injected into them.

Scenarios 5 and 6 stop a server; the suites that ran before in the same pytest session share
the launcher's default servers, so this suite runs a second pair in a state directory of its
own (``pin_testkit.local.ensure_up(state_dir=...)``). Starting a stopped server again is
``ensure_up`` once more: it reuses what answers and restarts what does not, on the same ports
with the same data.
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
from typing import Final

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pin_testkit.local import LocalServices, down, ensure_up
from pin_testkit.local.kafka import Kafka, ensure_libs, libs_current
from pin_testkit.local.layout import Layout, resolve_layout
from pin_testkit.local.postgres import Postgres, find_bindir, server_account
from pin_testkit.local.procs import file_lock
from pin_testkit.local.state import (
    KAFKA_CONTROLLER_PORT_ENV,
    KAFKA_PORT_ENV,
    PG_PORT_ENV,
    load_state,
)

__all__ = [
    "OwnServers",
    "clone_database",
    "create_template",
]

log = logging.getLogger(__name__)

STATE_PREFIX: Final = "pin-e2e-"
START_TIMEOUT: Final = 240.0
LIBS_LOCK_TIMEOUT: Final = 1800.0  # a first Maven copy of the broker's jars may take minutes


class OwnServers:
    """PostgreSQL + Kafka of this test session alone, in a fresh temporary state directory."""

    def __init__(self, services: LocalServices, state_dir: Path) -> None:
        self.services = services
        self.state_dir = state_dir
        self.layout = Layout(repo_root=resolve_layout().repo_root, state_dir=state_dir)
        self.stopped: set[str] = set()  # servers a scenario stopped and did not start again

    @classmethod
    def start(cls) -> OwnServers:
        state_dir = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
        state_dir.chmod(0o755)  # as root, PostgreSQL runs as `postgres`, which must enter it
        try:
            _share_broker_files(state_dir)
            services = _ensure_up(state_dir)
        except BaseException:
            _stop_and_remove(state_dir)
            raise
        return cls(services, state_dir)

    def close(self) -> None:
        _stop_and_remove(self.state_dir)

    # -- faults -------------------------------------------------------------------------------

    def stop_kafka(self) -> float:
        """A clean broker shutdown (SIGTERM); seconds it took."""
        started = time.monotonic()
        state = load_state(self.layout.state_file)
        assert state is not None
        kafka = Kafka(
            self.layout, state.kafka_port, state.kafka_controller_port, state.kafka_cluster_id
        )
        self.stopped.add("kafka")
        assert kafka.stop(), "the e2e broker was not running"
        return time.monotonic() - started

    def stop_postgres(self, *, mode: str = "fast") -> float:
        """``pg_ctl stop -m fast`` (or ``immediate``: a crash, recovery at the next start):
        every session is terminated; seconds it took."""
        started = time.monotonic()
        state = load_state(self.layout.state_file)
        assert state is not None
        self.stopped.add("postgres")
        stopped = Postgres(self.layout, state.pg_port).stop(
            find_bindir(), server_account(), mode=mode
        )
        assert stopped, "the e2e PostgreSQL was not running"
        return time.monotonic() - started

    def restart_stopped(self) -> float:
        """Start whatever is stopped, on its old ports with its old data; seconds it took."""
        started = time.monotonic()
        again = _ensure_up(self.state_dir)
        self.stopped.clear()
        assert again.kafka_bootstrap == self.services.kafka_bootstrap
        assert again.postgres_dsn == self.services.postgres_dsn
        return time.monotonic() - started


@contextlib.contextmanager
def _own_ports() -> Iterator[None]:
    """Hide PIN_LOCAL_*_PORT: they pin the shared servers' ports, never this suite's."""
    names = (PG_PORT_ENV, KAFKA_PORT_ENV, KAFKA_CONTROLLER_PORT_ENV)
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _ensure_up(state_dir: Path) -> LocalServices:
    with _own_ports():
        return ensure_up(state_dir=state_dir, timeout=START_TIMEOUT)


def _share_broker_files(state_dir: Path) -> None:
    """Link the launcher's broker jars and class-data archive instead of copying them again.

    Without this, ``ensure_up`` on a fresh state directory runs Maven for the jars, and the
    broker's first stop writes a 50 MB class-data archive (seconds, during scenario 5).
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


def create_template(admin_dsn: str, name: str) -> str:
    """An empty database ``name`` (dropped first if left over); its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(admin_dsn, dbname=name)


def clone_database(admin_dsn: str, template: str, name: str) -> str:
    """A copy of the migrated ``template`` database; its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return make_conninfo(admin_dsn, dbname=name)
