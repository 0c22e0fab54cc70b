"""pytest plugin: real PostgreSQL and Kafka for every package's integration tests.

Loaded through the ``pytest11`` entry point, so a test only names a fixture. Services are
found lazily: a run of pure unit tests starts nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pin_runtime.settings import secrets_forgotten_after
from pin_testkit.databases import DatabaseFactory
from pin_testkit.discovery import Services, ServiceUnavailableError, discover
from pin_testkit.topics import TopicFactory

if TYPE_CHECKING:
    from pin_testkit.private import PrivateKafka
    from pin_testkit.secured import SecuredKafka


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends a run the way Ctrl-C does, so every fixture's teardown still runs.

    Tests start processes and servers of their own (service processes, private brokers,
    Toxiproxy, Prometheus) that only their fixtures stop. By default SIGTERM kills pytest
    outright and leaves them running; as KeyboardInterrupt it unwinds the run and pytest
    tears every fixture down before it exits. A handler someone else installed is kept.
    """
    # The marker `pytest_collection_modifyitems` adds, known wherever the plugin runs.
    config.addinivalue_line(
        "markers", "integration: needs a real PostgreSQL or Kafka (found through pin_testkit)"
    )
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, signal.default_int_handler)


_SERVICE_FIXTURES = frozenset({"pin_services", "private_kafka", "secured_kafka"})
"""The roots every fixture that reaches a real PostgreSQL or Kafka grows from."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reaches a real service is an integration test: marked here from the
    fixtures it needs (directly or through other fixtures), so `-m "not integration"`
    (`make unit`) never starts a service, whatever a module's own marker says."""
    for item in items:
        if _SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _secrets_of_one_test() -> Iterator[None]:
    """A test stands for a process: the secrets its settings register (and `redact`
    scrubs) leave with it, so a password one test drew never masks another's output."""
    with secrets_forgotten_after():
        yield


@pytest.fixture(scope="session")
def pin_services(pytestconfig: pytest.Config) -> Iterator[Services]:
    """Both services, or a failed test that says how to get them (never a skip)."""
    cleanups: list[Callable[[], Any]] = []
    try:
        services = discover(os.environ, cleanups)
    except ServiceUnavailableError as exc:
        for cleanup in reversed(cleanups):
            cleanup()
        pytest.fail(str(exc), pytrace=False)
    # Which servers the run tested against, in its output: a fall back is never silent.
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(
                f"pin services: {services.source}: "
                f"{services.postgres_dsn}, {services.kafka_bootstrap}"
            )
    try:
        yield services
    finally:
        for cleanup in reversed(cleanups):
            cleanup()


@pytest.fixture(scope="session")
def postgres_admin_dsn(pin_services: Services) -> str:
    """A superuser DSN to the server's maintenance database."""
    return pin_services.postgres_dsn


@pytest.fixture(scope="session")
def kafka_bootstrap(pin_services: Services) -> str:
    """``host:port`` of the real Kafka broker."""
    return pin_services.kafka_bootstrap


@pytest.fixture(scope="session")
def database_factory(postgres_admin_dsn: str) -> Iterator[DatabaseFactory]:
    factory = DatabaseFactory(postgres_admin_dsn)
    yield factory
    factory.drop_templates()


@pytest.fixture
def fresh_database(database_factory: DatabaseFactory) -> Iterator[str]:
    """DSN of a new, empty database, dropped after the test."""
    dsn = database_factory.create()
    yield dsn
    database_factory.drop(dsn)


@pytest.fixture
def make_database(database_factory: DatabaseFactory) -> Iterator[Callable[..., str]]:
    """``make_database(key, build)``: a clone of the template ``key`` built once by ``build``."""
    created: list[str] = []

    def make(key: str, build: Callable[[str], object]) -> str:
        dsn = database_factory.from_template(key, build)
        created.append(dsn)
        return dsn

    yield make
    for dsn in created:
        database_factory.drop(dsn)


@pytest.fixture(scope="session")
def runtime_dsn(postgres_admin_dsn: str) -> Callable[..., str]:
    """``runtime_dsn(dsn, "identity_fanout_worker")``: ``dsn`` as the login user of that
    runtime group role (``pin_testkit.runtime_roles``), created on first use; with several
    groups, a login that is a member of each.

    Databases are migrated as the owner (the admin user); the code under test connects
    with this, so a statement its role was not granted fails the test with 42501.
    """
    from pin_testkit.runtime_roles import ensure_login  # noqa: PLC0415
    from pin_testkit.runtime_roles import runtime_dsn as as_login  # noqa: PLC0415

    ensured: set[tuple[str, ...]] = set()

    def make(dsn: str, group: str, *more: str) -> str:
        if (group, *more) not in ensured:
            ensure_login(postgres_admin_dsn, group, *more)
            ensured.add((group, *more))
        return as_login(dsn, group, *more)

    return make


@pytest.fixture
def kafka_topic(kafka_bootstrap: str) -> Iterator[Callable[..., str]]:
    """``kafka_topic(partitions=3)``: a topic no other test uses, deleted after the test."""
    factory = TopicFactory(kafka_bootstrap)
    yield factory.create
    factory.delete_all()


@pytest.fixture
def private_kafka() -> Iterator[PrivateKafka]:
    """A Kafka broker of this test alone, which it may ``stop()`` and ``start()``.

    A single-node KRaft broker from the launcher's jars in its own temporary state directory
    (own ports, own data), independent of ``kafka_bootstrap``; stopped and deleted afterwards,
    whatever the outcome of the test.
    """
    # Imported here: a run that never asks for one does not load the launcher.
    from pin_testkit.local.errors import LocalInfraError  # noqa: PLC0415
    from pin_testkit.private import PrivateKafka  # noqa: PLC0415

    try:
        broker = PrivateKafka.launch()
    except LocalInfraError as exc:
        pytest.fail(f"private Kafka broker: {exc}", pytrace=False)
    with broker:
        yield broker


@pytest.fixture(scope="session")
def secured_kafka() -> Iterator[SecuredKafka]:
    """A broker that requires TLS and SCRAM (and one listener that requires a client
    certificate), shared by the tests of a run that ask for it.

    The one ``pin-local env --secure`` described (``PIN_KAFKA_SECURE_BOOTSTRAP`` and friends),
    else a ``PrivateKafka`` launched with ``secure=True`` for this run: a CA made for it,
    SCRAM-SHA-512 and -256 credentials of one user written at format time. Tests only connect
    to it (it is never stopped before the end of the run); each creates its own topics.
    """
    from pin_testkit.local.errors import LocalInfraError  # noqa: PLC0415
    from pin_testkit.private import PrivateKafka  # noqa: PLC0415
    from pin_testkit.secured import SecuredKafka  # noqa: PLC0415

    try:
        described = SecuredKafka.from_environment(os.environ)
    except ValueError as exc:
        pytest.fail(f"secured Kafka broker: {exc}", pytrace=False)
    if described is not None:
        yield described
        return
    try:
        broker = PrivateKafka.launch(secure=True)
    except LocalInfraError as exc:
        pytest.fail(f"secured Kafka broker: {exc}", pytrace=False)
    with broker:
        yield broker.secured
