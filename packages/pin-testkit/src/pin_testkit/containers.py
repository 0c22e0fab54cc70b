"""PostgreSQL and Kafka as testcontainers, for the plugin's discovery (``pin_testkit.discovery``).

Both run as generic containers: testcontainers' ``KafkaContainer`` is written for
Confluent's images and refuses ``apache/kafka``, and its ``PostgresContainer`` waits with a
password login where the tests need trust (they log in as password-less runtime roles).

Images: ``PIN_POSTGRES_IMAGE`` / ``PIN_KAFKA_IMAGE`` when set; else the bases
``infra/docker/images.sh`` builds from Debian and Maven Central (``pin-base/postgres:15``,
``pin-base/kafka:4.2.0``) when the engine has them; else the public ``postgres:15`` and
``apache/kafka:4.2.0``. Both images read the same variables.

Network: host networking where the engine has no bridge network (``dockerd
--bridge=none``), each server on a free loopback port; otherwise the server's port is
published on 127.0.0.1 under the same number, so the address Kafka advertises is right
from both sides (Docker Desktop). ``PIN_CONTAINERS_NETWORK=host|bridge`` overrides.

Ryuk (testcontainers' reaper, an image of its own from Docker Hub) is disabled: the plugin
removes both containers at the end of the session, and each carries the label
``pin-platform=testcontainers`` so ``infra/docker/engine.sh down`` removes what a killed run
left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pin_testkit.ports import free_port, listens
from pin_testkit.waiting import wait_until

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

__all__ = [
    "PUBLIC_IMAGES",
    "ContainerServices",
    "choose_images",
    "engine_of",
    "start_containers",
]

POSTGRES_IMAGE_VAR: Final = "PIN_POSTGRES_IMAGE"
KAFKA_IMAGE_VAR: Final = "PIN_KAFKA_IMAGE"
NETWORK_VAR: Final = "PIN_CONTAINERS_NETWORK"
LOCAL_IMAGES: Final = ("pin-base/postgres:15", "pin-base/kafka:4.2.0")
PUBLIC_IMAGES: Final = ("postgres:15", "apache/kafka:4.2.0")
LABEL: Final = {"pin-platform": "testcontainers"}
# What pin-local runs: a throwaway server, durability traded for speed.
POSTGRES_SETTINGS: Final = (
    "max_connections=200",
    "max_prepared_transactions=20",
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
)
START_TIMEOUT: Final = 120.0


@dataclass(frozen=True, slots=True)
class ContainerServices:
    postgres_dsn: str
    kafka_bootstrap: str
    description: str


def choose_images(environ: Mapping[str, str], local_images: set[str]) -> tuple[str, str]:
    """(PostgreSQL image, Kafka image): the variables', else the local bases the engine
    has, else the public ones."""
    chosen = []
    for var, local, public in zip(
        (POSTGRES_IMAGE_VAR, KAFKA_IMAGE_VAR), LOCAL_IMAGES, PUBLIC_IMAGES, strict=True
    ):
        named = environ.get(var, "").strip()
        chosen.append(named or (local if local in local_images else public))
    return chosen[0], chosen[1]


def _network_mode(environ: Mapping[str, str], has_bridge: bool) -> str:
    named = environ.get(NETWORK_VAR, "").strip()
    if named and named not in ("host", "bridge"):
        raise ValueError(f"{NETWORK_VAR}={named!r}: expected host or bridge")
    return named or ("bridge" if has_bridge else "host")


def _container(image: str, network: str, port: int) -> DockerContainer:
    from testcontainers.core.container import DockerContainer  # noqa: PLC0415 - only with an engine

    if network == "host":
        return DockerContainer(image).with_kwargs(labels=dict(LABEL), network_mode="host")
    container = DockerContainer(image).with_kwargs(labels=dict(LABEL))
    # Published on loopback alone, under the port the server listens on in the container.
    container.ports[f"{port}/tcp"] = ("127.0.0.1", port)  # type: ignore[assignment]
    return container


def _postgres(image: str, network: str) -> tuple[DockerContainer, str]:
    port = free_port()
    listen = "127.0.0.1" if network == "host" else "*"
    settings = [f"listen_addresses={listen}", *POSTGRES_SETTINGS]
    container = (
        _container(image, network, port)
        .with_envs(
            POSTGRES_USER="pin",
            POSTGRES_PASSWORD="pin",  # noqa: S106 - a throwaway server's superuser
            POSTGRES_DB="postgres",
            # Trust: the tests log in as runtime roles that have no password.
            POSTGRES_HOST_AUTH_METHOD="trust",
            PGPORT=str(port),
        )
        .with_command(["postgres", *(a for s in settings for a in ("-c", s))])
    )
    return container, f"postgresql://pin:pin@127.0.0.1:{port}/postgres"


def _kafka(image: str, network: str) -> tuple[DockerContainer, str]:
    port, controller = free_port(), free_port()
    listen = "127.0.0.1" if network == "host" else "0.0.0.0"  # noqa: S104 - inside the container
    container = _container(image, network, port).with_envs(
        CLUSTER_ID="5L6g3nShT-eMCtK--X86sw",
        KAFKA_NODE_ID="1",
        KAFKA_PROCESS_ROLES="broker,controller",
        KAFKA_LISTENERS=f"PLAINTEXT://{listen}:{port},CONTROLLER://127.0.0.1:{controller}",
        KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://127.0.0.1:{port}",
        KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
        KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        KAFKA_INTER_BROKER_LISTENER_NAME="PLAINTEXT",
        KAFKA_CONTROLLER_QUORUM_VOTERS=f"1@127.0.0.1:{controller}",
        KAFKA_NUM_PARTITIONS="3",
        KAFKA_AUTO_CREATE_TOPICS_ENABLE="false",
        KAFKA_MIN_INSYNC_REPLICAS="1",
        KAFKA_DEFAULT_REPLICATION_FACTOR="1",
        KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
        KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS="10",
        KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
        KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
        KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR="1",
        KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR="1",
        KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
        KAFKA_HEAP_OPTS="-Xms256m -Xmx768m",
    )
    return container, f"127.0.0.1:{port}"


def _postgres_answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def _kafka_answers(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    if not listens(int(port), host):
        return False  # nothing listens yet: skip librdkafka's connection-refused noise
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=3)
    except KafkaException:
        return False
    return True


def _running(container: DockerContainer, what: str) -> Callable[[], None]:
    """Fails the wait at once, with the container's log, when it exited."""

    def check() -> None:
        container.reload()
        if container.status not in ("created", "running"):
            out, err = container.get_logs()
            tail = (out + err).decode(errors="replace")[-2000:]
            raise RuntimeError(f"{what} container exited ({container.status}):\n{tail}")

    return check


def _await(condition: Callable[[], bool], alive: Callable[[], None], what: str) -> None:
    def ready() -> bool:
        alive()
        return condition()

    wait_until(ready, timeout=START_TIMEOUT, what=what, interval=0.5)


def start_containers(
    environ: Mapping[str, str], cleanups: list[Callable[[], Any]]
) -> ContainerServices:
    """Start both servers and wait until each answers; ``cleanups`` receives their removal."""
    from testcontainers.core.config import testcontainers_config  # noqa: PLC0415
    from testcontainers.core.docker_client import DockerClient  # noqa: PLC0415

    testcontainers_config.ryuk_disabled = True
    client = DockerClient().client
    local_images = {tag for image in client.images.list() for tag in image.tags}
    has_bridge = bool(client.networks.list(names=["bridge"]))
    client.close()
    network = _network_mode(environ, has_bridge)
    postgres_image, kafka_image = choose_images(environ, local_images)

    postgres, dsn = _postgres(postgres_image, network)
    kafka, bootstrap = _kafka(kafka_image, network)
    for container in (postgres, kafka):
        container.start()
        cleanups.append(container.stop)
    _await(lambda: _postgres_answers(dsn), _running(postgres, "PostgreSQL"), f"PostgreSQL {dsn}")
    _await(lambda: _kafka_answers(bootstrap), _running(kafka, "Kafka"), f"Kafka {bootstrap}")
    return ContainerServices(
        postgres_dsn=dsn,
        kafka_bootstrap=bootstrap,
        description=f"{postgres_image} and {kafka_image}, {network} network",
    )


def engine_of(environ: Mapping[str, str]) -> str:
    """Where the engine is asked, for messages."""
    return environ.get("DOCKER_HOST", "") or "unix:///var/run/docker.sock"
