"""End-to-end fixtures: the suite's own PostgreSQL and Kafka, one system per scenario.

The suite stops and starts servers (scenarios 5 and 6), so it never touches the servers the
other suites of the same pytest session use: ``e2e_servers`` runs a second pair in a temporary
state directory and takes it down at the end of the session, whatever happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pin_e2e.report import Recorder
from pin_e2e.stack import Servers, StackServers, topology
from pin_e2e.system import (
    IDENTITY_TEMPLATE,
    REWARDS_MEMBERSHIP,
    REWARDS_TEMPLATE,
    System,
    cli,
    process_environment,
)

from identity_fanout.schema import migrate_database
from pin_testkit.databases import create_database
from pin_testkit.private_servers import PrivateServers
from pin_testkit.runtime_roles import all_logins, ensure_login

_RECORDER = pytest.StashKey[Recorder]()


@pytest.fixture(scope="session")
def e2e_servers() -> Iterator[Servers]:
    """PostgreSQL + Kafka of this suite alone (``pin_testkit.private_servers``, or the compose
    stack's in the containers topology, ``pin_e2e.stack``), with migrated template databases
    (migrated as the owner) and the runtime roles' login users."""
    servers: Servers = (
        StackServers.attach()
        if topology() == "containers"
        else PrivateServers.launch(prefix="pin-e2e-")
    )
    try:
        admin = servers.services.postgres_dsn
        migrate_database(create_database(admin, IDENTITY_TEMPLATE, replace=True))
        # The rewards schema as an operator migrates it: the service's own command.
        rewards = create_database(admin, REWARDS_TEMPLATE, replace=True)
        env = process_environment({"REWARDS_MEMBERSHIP_DATABASE_DSN": rewards})
        cli(REWARDS_MEMBERSHIP, ["migrate"], env)
        # The login users of the runtime roles the migrations created; every service
        # process of a scenario connects as one (pin_e2e.system).
        for _, groups in all_logins():
            ensure_login(admin, *groups)
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="session")
def recorder(request: pytest.FixtureRequest) -> Recorder:
    """Collects each scenario's figures for the summary printed at the end of the run."""
    found = request.config.stash.get(_RECORDER, None)
    if found is None:
        found = Recorder()
        request.config.stash[_RECORDER] = found
    return found


@pytest.fixture
def make_system(e2e_servers: Servers, tmp_path: Path) -> Iterator[Callable[[str], System]]:
    """``make_system("s1")``: fresh databases and consumer group; processes stopped after."""
    systems: list[System] = []

    def make(name: str) -> System:
        system = System.create(e2e_servers, name, tmp_path)
        systems.append(system)
        return system

    yield make
    for system in systems:
        system.stop_all()
    if e2e_servers.stopped:  # a scenario failed during its outage: the next one needs them
        e2e_servers.restart_stopped()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    found = terminalreporter.config.stash.get(_RECORDER, None)
    if found is None or not found.scenarios:
        return
    terminalreporter.write_sep("=", "end-to-end summary")
    width = terminalreporter.config.get_terminal_writer().fullwidth
    terminalreporter.write(found.render(max(160, width)))
