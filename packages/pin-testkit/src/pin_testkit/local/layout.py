"""Where the launcher finds the repository and keeps its state."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pin_testkit.local.errors import LocalInfraError

POM_RELATIVE = Path("infra/local/kafka/pom.xml")
STATE_RELATIVE = Path("infra/local/.state")
STATE_DIR_ENV = "PIN_LOCAL_STATE_DIR"


def find_repo_root(*starts: Path) -> Path | None:
    """The nearest directory at or above one of ``starts`` that holds the Kafka pom."""
    for start in starts:
        for candidate in (start, *start.parents):
            if (candidate / POM_RELATIVE).is_file():
                return candidate
    return None


@dataclass(frozen=True, slots=True)
class Layout:
    """Every path of the local servers, derived from the state directory."""

    repo_root: Path | None
    state_dir: Path

    @property
    def pom(self) -> Path:
        if self.repo_root is None:
            raise LocalInfraError(
                f"cannot find {POM_RELATIVE} above {Path.cwd()}: "
                "run pin-local inside the repository"
            )
        return self.repo_root / POM_RELATIVE

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "lock"

    # PostgreSQL: everything below pg_dir belongs to the user the server runs as.
    @property
    def pg_dir(self) -> Path:
        return self.state_dir / "postgres"

    @property
    def pg_data(self) -> Path:
        return self.pg_dir / "data"

    @property
    def pg_socket_dir(self) -> Path:
        return self.pg_dir / "run"

    @property
    def pg_log(self) -> Path:
        return self.pg_dir / "postgres.log"

    # Kafka
    @property
    def kafka_dir(self) -> Path:
        return self.state_dir / "kafka"

    @property
    def kafka_libs(self) -> Path:
        return self.kafka_dir / "libs"

    @property
    def kafka_data(self) -> Path:
        return self.kafka_dir / "data"

    @property
    def kafka_logs(self) -> Path:
        return self.kafka_dir / "logs"

    @property
    def kafka_properties(self) -> Path:
        return self.kafka_dir / "server.properties"

    @property
    def kafka_log4j(self) -> Path:
        return self.kafka_dir / "log4j2.xml"

    @property
    def kafka_pid(self) -> Path:
        return self.kafka_dir / "kafka.pid"

    @property
    def kafka_console_log(self) -> Path:
        return self.kafka_logs / "console.log"

    @property
    def kafka_server_log(self) -> Path:
        return self.kafka_logs / "server.log"


def resolve_layout(state_dir: Path | None = None) -> Layout:
    """Find the repository (from this module, then the working directory) and the state dir.

    ``state_dir`` wins, then ``$PIN_LOCAL_STATE_DIR``, then ``<repo>/infra/local/.state``.
    """
    root = find_repo_root(Path(__file__).resolve().parent, Path.cwd().resolve())
    if state_dir is None:
        override = os.environ.get(STATE_DIR_ENV, "").strip()
        if override:
            state_dir = Path(override)
        elif root is not None:
            state_dir = root / STATE_RELATIVE
        else:
            raise LocalInfraError(
                f"cannot find {POM_RELATIVE} above {Path.cwd()} and {STATE_DIR_ENV} is not set"
            )
    return Layout(repo_root=root, state_dir=state_dir.expanduser().resolve())
