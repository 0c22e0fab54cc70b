"""A Kafka broker of one test's own, which the test may stop and start (fault injection).

The session broker (``kafka_bootstrap``) is shared by every test of a run; stopping it would
break them all. :class:`PrivateKafka` runs a second single-node KRaft broker from the same jars
(``pin_testkit.local``, fetched once by Maven) in a temporary state directory of its own, on
free loopback ports, with a small heap. ``stop()`` and ``start()`` keep its ports and its data,
so clients see a broker that went away and came back, as in production.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, Self, TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pin_runtime.kafka import create_admin, ensure_topics
from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.kafka import (
    MAIN_CLASS,
    JavaRuntime,
    Kafka,
    KafkaSecurity,
    ProxiedListener,
    ScramUser,
    class_data_archive,
    ensure_libs,
    find_java,
    libs_current,
    render_log4j2,
    render_server_properties,
)
from pin_testkit.local.layout import Layout, resolve_layout
from pin_testkit.local.procs import (
    POLL_INTERVAL,
    Deadline,
    cmdline,
    file_lock,
    pid_alive,
    read_pid,
    terminate,
    wait_gone,
    write_atomic,
)
from pin_testkit.local.secure import secured_of
from pin_testkit.local.state import new_cluster_id, pick_port
from pin_testkit.local.tls import write_tls_files
from pin_testkit.ports import listens
from pin_testkit.secured import SecuredKafka

__all__ = ["PrivateKafka"]

log = logging.getLogger(__name__)
_P = TypeVar("_P", bound="PrivateKafka")

PRIVATE_HEAP: Final = ("-Xms128m", "-Xmx512m")
STATE_PREFIX: Final = "pin-private-kafka-"
OWNER_FILE: Final = "owner.pid"
START_TIMEOUT: Final = 120.0
STOP_TIMEOUT: Final = 30.0
LIBS_LOCK_TIMEOUT: Final = 1800.0  # the first Maven copy of the jars may take minutes
PROBE_TIMEOUT: Final = 2.0
PORT_ATTEMPTS: Final = 3
_PORT_LOST: Final = ("Unable to start acceptor", "Address already in use", "taken by another")
PRIVATE_SETTINGS: Final = {
    # After a crash (kill()) the controller refuses the new incarnation of the broker until
    # the old one's session expires (DUPLICATE_BROKER_REGISTRATION): 9 s by default.
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "3000",
}


def _lost_a_port(message: str) -> bool:
    return any(sign in message for sign in _PORT_LOST)


class _Broker(Kafka):
    """The launcher's broker with a smaller heap that only reads the shared class-data archive.

    Writing an archive at every clean stop (as the shared broker's first stop does) would
    slow each ``stop()`` down by seconds; mapping the shared one shortens the start-up.
    """

    heap = PRIVATE_HEAP

    def __init__(
        self,
        layout: Layout,
        port: int,
        controller_port: int,
        shared_dir: Path,
        security: KafkaSecurity | None,
        *,
        proxied: tuple[ProxiedListener, ...] = (),
    ) -> None:
        super().__init__(layout, port, controller_port, new_cluster_id(), security, proxied=proxied)
        self._shared_dir = shared_dir

    def write_config(self) -> bool:
        """The launcher's settings, then this broker's own (later keys win in a properties file)."""
        self.layout.kafka_logs.mkdir(parents=True, exist_ok=True)
        own = "".join(f"{key}={value}\n" for key, value in PRIVATE_SETTINGS.items())
        write_atomic(self.layout.kafka_properties, render_server_properties(self.config) + own)
        write_atomic(self.layout.kafka_log4j, render_log4j2())
        return True

    def kill(self) -> None:
        """SIGKILL, and wait until the process is gone (a no-op when it is not running)."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not wait_gone(pid, Deadline.after(10.0)):
            raise LocalInfraError(f"private Kafka (pid {pid}) survived SIGKILL")
        self.layout.kafka_pid.unlink(missing_ok=True)

    def class_data_flag(self, java: JavaRuntime, libs: Path) -> str:
        archive = class_data_archive(self._shared_dir, java, libs)
        return f"-XX:SharedArchiveFile={archive}" if archive.is_file() else "-Xshare:auto"


class PrivateKafka:
    """A single-node KRaft broker of its own: ``bootstrap``, ``stop()``, ``start()``.

    ``PrivateKafka.launch()`` creates and starts one; use it as a context manager (or call
    ``close()``) so that it is stopped and its state directory removed. Not thread-safe: drive
    it from the test's thread (clients in other threads only talk to the broker).
    """

    def __init__(
        self,
        *,
        shared: Layout | None = None,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
        secure: bool = False,
        proxied: int = 0,
    ) -> None:
        sweep_orphans()
        self._shared = shared if shared is not None else resolve_layout()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._state = _StateDir()
        self.state_dir = self._state.path
        self._broker = _new_broker(self._shared, self.state_dir, secure=secure, proxied=proxied)
        self._runtime = _Runtime(self._shared)
        self.last_start_seconds: float | None = None
        self.last_stop_seconds: float | None = None

    @classmethod
    def launch(
        cls,
        *,
        shared: Layout | None = None,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
        secure: bool = False,
        proxied: int = 0,
    ) -> Self:
        """A new broker, started and answering; closed again if it cannot start.

        ``secure=True`` adds a SASL_SSL (SCRAM) and an SSL (mutual TLS) listener: see
        :attr:`secured`. ``proxied=N`` adds N listeners for clients behind proxies (one per
        process whose path to the broker a test cuts on its own): see :attr:`proxied`.
        """
        return _started_with_retries(
            lambda: cls(
                shared=shared,
                start_timeout=start_timeout,
                stop_timeout=stop_timeout,
                secure=secure,
                proxied=proxied,
            )
        )

    # -- addresses ------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``; the same across ``stop()`` and ``start()``."""
        return self._broker.bootstrap

    @property
    def port(self) -> int:
        return self._broker.config.port

    @property
    def controller_port(self) -> int:
        return self._broker.config.controller_port

    @property
    def secured(self) -> SecuredKafka:
        """Addresses and credentials of the secured listeners (``secure=True`` only)."""
        security = self._broker.config.security
        if security is None:
            raise LocalInfraError("this private Kafka was launched without secure=True")
        return secured_of(self.bootstrap, security)

    @property
    def proxied(self) -> tuple[ProxiedListener, ...]:
        """The listeners for clients behind proxies (``proxied=N``): start a proxy on each
        one's ``advertised_port`` forwarding to its ``upstream``, give clients its
        ``bootstrap``."""
        return self._broker.config.proxied

    @property
    def cluster_id(self) -> str:
        return self._broker.cluster_id

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return self._broker.pid()

    @property
    def running(self) -> bool:
        return self.pid is not None

    def answers(self, timeout: float = PROBE_TIMEOUT) -> bool:
        """Whether the broker answers a metadata request within ``timeout`` seconds."""
        return self._broker.answers(timeout=timeout)

    def refuses_connections(self) -> bool:
        """Whether nothing listens on any of the broker's ports."""
        return not any(listens(p) for p in self._broker.ports)

    # -- fault injection ------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> float:
        """Start the broker on its ports with its data; return once every partition leads.

        A no-op when it already runs. Returns the seconds it took.
        """
        started = time.monotonic()
        deadline = Deadline.after(self.start_timeout if timeout is None else timeout)
        pid = self._broker.pid()
        if pid is None:
            taken = [p for p in self._broker.ports if listens(p)]
            if taken:
                raise LocalInfraError(
                    f"private Kafka cannot restart: port(s) {taken} on 127.0.0.1 were taken "
                    "by another process while it was stopped"
                )
            java, libs = self._runtime.java_and_libs()
            self._broker.write_config()
            if not self._broker.storage.formatted():
                self._broker.format(java, libs)
            log.info("private kafka: starting on %s", self.bootstrap)
            pid = self._broker.start(java, libs)
        try:
            self._broker.wait_answering(pid, deadline)
            _wait_for_leaders(self.bootstrap, deadline, self.log_tails)
        except BaseException:
            self._broker.stop(grace=5.0)  # never leave a broker that did not come up
            raise
        self.last_start_seconds = time.monotonic() - started
        log.info("private kafka: answering after %.1fs", self.last_start_seconds)
        return self.last_start_seconds

    def stop(self, timeout: float | None = None) -> float:
        """SIGTERM (a clean shutdown; SIGKILL after ``timeout``) and wait until the process is
        gone and both ports refuse connections. A no-op when it is stopped. The seconds taken.
        """
        started = time.monotonic()
        grace = self.stop_timeout if timeout is None else timeout
        self._broker.stop(grace=grace)
        _wait_ports_closed(self._broker.ports, Deadline.after(10.0))
        self.last_stop_seconds = time.monotonic() - started
        return self.last_stop_seconds

    def kill(self) -> float:
        """SIGKILL: a crash (no clean shutdown; the next ``start()`` recovers the logs)."""
        started = time.monotonic()
        self._broker.kill()
        _wait_ports_closed(self._broker.ports, Deadline.after(10.0))
        self.last_stop_seconds = time.monotonic() - started
        return self.last_stop_seconds

    # -- helpers --------------------------------------------------------------------------

    def admin(self, client_id: str = "pin-testkit-private") -> AdminClient:
        return create_admin(self.bootstrap, client_id=client_id)

    def create_topic(
        self, name: str | None = None, partitions: int = 3, *, timeout: float = 30.0
    ) -> str:
        """Create ``name`` (default: a unique name) and wait for its leaders; the name."""
        topic = name or f"pin-test.{uuid.uuid4().hex[:12]}"
        ensure_topics(self.admin(), [(topic, partitions)], timeout=timeout)
        return topic

    def log_tails(self) -> str:
        """The end of the broker's console and server logs, for failure messages."""
        return self._broker.log_tails()

    def close(self) -> None:
        """Stop the broker (SIGKILL after a short grace) and delete its state directory."""
        try:
            if self._broker.pid() is not None:
                self._broker.stop(grace=10.0)
        finally:
            self._state.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PrivateKafka({self.bootstrap}, pid={self.pid}, state_dir={self.state_dir})"


class _StateDir:
    """The broker's temporary state directory, marked with its owner's pid so that a later
    run can tell it is orphaned (`sweep_orphans`); `close()` removes it."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
        (self.path / OWNER_FILE).write_text(f"{os.getpid()}\n", encoding="ascii")

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class _Runtime:
    """Java and the Kafka jars, found (and fetched by the first run) once per broker."""

    def __init__(self, shared: Layout) -> None:
        self._shared = shared
        self._found: tuple[JavaRuntime, Path] | None = None

    def java_and_libs(self) -> tuple[JavaRuntime, Path]:
        if self._found is None:
            java = find_java()
            if libs_current(self._shared):
                libs = self._shared.kafka_libs
            else:  # the first run fetches them: serialise with `pin-local up`
                with file_lock(self._shared.lock_file, LIBS_LOCK_TIMEOUT):
                    libs = ensure_libs(self._shared)
            self._found = (java, libs)
        return self._found


def _new_broker(shared: Layout, state_dir: Path, *, secure: bool, proxied: int) -> _Broker:
    """A broker in `state_dir` on free loopback ports: its own, a controller's, the secured
    listeners' (`secure`) and `proxied` pairs of a listener and its advertised proxy port."""
    port = pick_port(set())
    controller_port = pick_port({port})
    layout = Layout(repo_root=shared.repo_root, state_dir=state_dir)
    security = _security(state_dir, {port, controller_port}) if secure else None
    taken = {port, controller_port}
    if security is not None:
        taken |= {security.sasl_port, security.ssl_port}
    listeners: list[ProxiedListener] = []
    for _ in range(proxied):
        own = pick_port(taken)
        advertised = pick_port(taken | {own})
        taken |= {own, advertised}
        listeners.append(ProxiedListener(own, advertised))
    return _Broker(
        layout, port, controller_port, shared.kafka_dir, security, proxied=tuple(listeners)
    )


def _started_with_retries(new: Callable[[], _P]) -> _P:
    """A broker from `new()`, started; closed again if it cannot start. Ports are picked
    free, then bound by the JVM seconds later: on a busy machine another process may take
    one in between, and then a new broker on new ports is tried."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        broker = new()
        try:
            broker.start()
        except LocalInfraError as exc:
            broker.close()
            if attempt == PORT_ATTEMPTS or not _lost_a_port(str(exc)):
                raise
            log.warning("private kafka: a port was taken during start-up, new ports")
            continue
        except BaseException:
            broker.close()
            raise
        return broker
    raise AssertionError("unreachable")  # the loop returns or raises


def _wait_for_leaders(bootstrap: str, deadline: Deadline, log_tails: Callable[[], str]) -> None:
    """After a restart, wait until every partition of every topic has its leader back."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    while True:
        try:
            topics = admin.list_topics(timeout=max(0.5, min(3.0, deadline.remaining())))
            if all(
                p.leader >= 0 and p.error is None
                for t in topics.topics.values()
                for p in t.partitions.values()
            ):
                return
        except KafkaException:
            pass
        if deadline.expired():
            raise LocalInfraError(
                f"private Kafka on {bootstrap} has partitions without a leader; {log_tails()}"
            )
        time.sleep(POLL_INTERVAL)


def _wait_ports_closed(ports: Iterable[int], deadline: Deadline) -> None:
    while any(listens(p) for p in ports):
        if deadline.expired():
            raise LocalInfraError(
                f"private Kafka's ports {list(ports)} still accept connections after it stopped"
            )
        time.sleep(POLL_INTERVAL)


def _security(state_dir: Path, taken: set[int]) -> KafkaSecurity:
    """Two more ports, a new CA with broker and client certificates, one SCRAM user."""
    sasl_port = pick_port(taken)
    ssl_port = pick_port({*taken, sasl_port})
    return KafkaSecurity(
        sasl_port=sasl_port,
        ssl_port=ssl_port,
        tls=write_tls_files(state_dir / "tls"),
        users=(ScramUser("pin-client", secrets.token_urlsafe(18)),),
    )


def sweep_orphans(root: Path | None = None) -> list[Path]:
    """Stop and delete private brokers whose test process died without cleaning up.

    A broker runs in its own session (it survives its parent), so a test run killed with
    SIGKILL leaves it behind; the next run that asks for one cleans up. The removed dirs.
    """
    removed: list[Path] = []
    for state_dir in Path(root or tempfile.gettempdir()).glob(f"{STATE_PREFIX}*"):
        owner = read_pid(state_dir / OWNER_FILE)
        if owner is None or pid_alive(owner):
            continue  # being set up, or its owner still runs
        layout = Layout(repo_root=None, state_dir=state_dir)
        pid = read_pid(layout.kafka_pid)
        if pid is not None and pid_alive(pid):
            argv = cmdline(pid)
            if MAIN_CLASS in argv and str(layout.kafka_properties) in argv:
                log.warning("private kafka: stopping orphan pid %d of %s", pid, state_dir)
                terminate(pid, grace=5.0)
        shutil.rmtree(state_dir, ignore_errors=True)
        removed.append(state_dir)
    return removed
