"""A single-node KRaft Kafka broker run from jars that Maven copies out of Maven Central."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pin_testkit.local.errors import LocalInfraError, MissingPrerequisiteError
from pin_testkit.local.layout import Layout
from pin_testkit.local.procs import (
    POLL_INTERVAL,
    Deadline,
    cmdline,
    pid_alive,
    read_pid,
    spawn_detached,
    tail,
    terminate,
    write_atomic,
)
from pin_testkit.local.tls import TlsFiles
from pin_testkit.ports import listens

log = logging.getLogger(__name__)

MIN_JAVA = 17
POM_HASH_FILE = ".pom.sha256"
MAIN_CLASS = "kafka.Kafka"
HEAP = ("-Xms256m", "-Xmx768m")
# Kafka's own defaults from kafka-run-class.sh, plus: die on OOM instead of limping on.
GC_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
)
STOP_GRACE = 30.0
ARCHIVE_AT_EXIT = "-XX:ArchiveClassesAtExit="
PARTIAL = ".partial"


SCRAM_MECHANISMS: tuple[str, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256")
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


@dataclass(frozen=True, slots=True)
class ScramUser:
    name: str
    password: str

    def __repr__(self) -> str:
        return f"ScramUser({self.name!r}, password='***')"


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """The secured listeners of a broker, beside its PLAINTEXT one.

    ``SASL_SSL`` on ``sasl_port``: TLS with the broker certificate of ``tls``, then SCRAM
    (every mechanism of ``SCRAM_MECHANISMS``) against ``users``, whose credentials the storage
    format writes into the cluster metadata. ``SSL`` on ``ssl_port``: TLS that requires a
    client certificate signed by the CA of ``tls`` (mutual TLS; the principal is the
    certificate's subject). The PLAINTEXT listener stays for the broker's own traffic and the
    launcher's probes: the controller and inter-broker listeners are loopback only.
    """

    sasl_port: int
    ssl_port: int
    tls: TlsFiles
    users: tuple[ScramUser, ...]

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that create every user for every mechanism."""
        args: list[str] = []
        for user in self.users:
            for mechanism in SCRAM_MECHANISMS:
                args += ["--add-scram", f"{mechanism}=[name={user.name},password={user.password}]"]
        return args


@dataclass(frozen=True, slots=True)
class ProxiedListener:
    """A plaintext listener on `port` that advertises `advertised_port` instead: a proxy
    (Toxiproxy) listening there and forwarding to `port` sees every request of the clients
    that bootstrap through it, since the metadata sends them back to the proxy."""

    port: int
    advertised_port: int

    @property
    def upstream(self) -> str:
        """Where the proxy forwards to."""
        return f"127.0.0.1:{self.port}"

    @property
    def bootstrap(self) -> str:
        """What the proxied clients are given (the proxy's own address)."""
        return f"127.0.0.1:{self.advertised_port}"


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    port: int
    controller_port: int
    log_dir: Path
    node_id: int = 1
    num_partitions: int = 3
    security: KafkaSecurity | None = None
    proxied: tuple[ProxiedListener, ...] = ()


def _escape(value: str) -> str:
    """A java.util.Properties value: backslashes and a leading blank need escaping."""
    value = value.replace("\\", "\\\\")
    return "\\" + value if value[:1] in {" ", "\t"} else value


def _security_settings(security: KafkaSecurity) -> dict[str, str]:
    tls = security.tls
    settings = {
        "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        # Kafka reads PEM directly: the key store holds key + certificate chain, the trust
        # store the CA that signs client certificates (mutual TLS on the SSL listener).
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": _escape(str(tls.broker_keystore)),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": _escape(str(tls.client.ca_file)),
        "ssl.enabled.protocols": "TLSv1.3,TLSv1.2",
        "listener.name.ssl.ssl.client.auth": "required",
        # ACLs are enforced, and open until one is added: a resource without any ACL is
        # allowed to everyone, so a test takes a permission away with a DENY ACL of its own
        # (`pin_testkit.secured.TopicAcls`) and gives it back by deleting it. The broker's
        # own traffic (controller, inter-broker, the loopback PLAINTEXT listener that tests
        # create topics and ACLs through) is ANONYMOUS, a super user.
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true",
        "super.users": "User:ANONYMOUS",
    }
    for mechanism in SCRAM_MECHANISMS:
        settings[f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config"] = (
            SCRAM_LOGIN_MODULE
        )
    return settings


def render_server_properties(config: KafkaConfig) -> str:
    broker = f"127.0.0.1:{config.port}"
    controller = f"127.0.0.1:{config.controller_port}"
    listeners = f"PLAINTEXT://{broker},CONTROLLER://{controller}"
    protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    security = config.security
    if security is not None:
        listeners += (
            f",SASL_SSL://127.0.0.1:{security.sasl_port},SSL://127.0.0.1:{security.ssl_port}"
        )
        protocols += ",SASL_SSL:SASL_SSL,SSL:SSL"
    advertised = listeners
    for n, proxied in enumerate(config.proxied):
        listeners += f",PROXIED{n}://127.0.0.1:{proxied.port}"
        advertised += f",PROXIED{n}://127.0.0.1:{proxied.advertised_port}"
        protocols += f",PROXIED{n}:PLAINTEXT"
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(config.node_id),
        "controller.quorum.bootstrap.servers": controller,
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        "log.dirs": _escape(str(config.log_dir)),
        "num.partitions": str(config.num_partitions),
        "auto.create.topics.enable": "false",
        "min.insync.replicas": "1",
        "default.replication.factor": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    if security is not None:
        settings |= _security_settings(security)
    head = "# Written by pin-local at every start; edits are overwritten.\n"
    return head + "".join(f"{key}={value}\n" for key, value in settings.items())


def render_log4j2() -> str:
    """log4j2 configuration: all to <logs>/server.log (size-rolled), nothing to the console."""
    return """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by pin-local. kafka.logs.dir is a JVM system property set by the launcher. -->
<Configuration status="warn">
  <Appenders>
    <RollingFile name="server" fileName="${sys:kafka.logs.dir}/server.log"
                 filePattern="${sys:kafka.logs.dir}/server.log.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="20 MB"/></Policies>
      <DefaultRolloverStrategy max="3"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="warn"/>
    <Logger name="state.change.logger" level="warn"/>
    <Logger name="kafka.authorizer.logger" level="warn"/>
    <Root level="info"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
"""


# -- prerequisites ---------------------------------------------------------------------------
def parse_java_major(version_output: str) -> int | None:
    """The feature release of ``java -version`` output ('1.8.0_x' -> 8, '17.0.15' -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@dataclass(frozen=True, slots=True)
class JavaRuntime:
    path: Path
    major: int
    fingerprint: str  # identifies the JVM build, which a class-data archive is tied to


def find_java() -> JavaRuntime:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH; at least Java 17."""
    java_home = os.environ.get("JAVA_HOME", "").strip()
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    hint = "install a JDK >= 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    if not java or not Path(java).is_file():
        where = f"$JAVA_HOME/bin/java ({java_home})" if java_home else "java on PATH"
        raise MissingPrerequisiteError(where, hint)
    done = subprocess.run(  # noqa: S603 - argv built here from resolved programs
        [java, "-version"], capture_output=True, text=True, check=False, timeout=60
    )
    major = parse_java_major(done.stderr + done.stdout)
    if major is None or major < MIN_JAVA:
        raise MissingPrerequisiteError(f"Java >= {MIN_JAVA} (found {java}: {major})", hint)
    identity = f"{Path(java).resolve()}\n{done.stderr}{done.stdout}"
    fingerprint = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return JavaRuntime(path=Path(java), major=major, fingerprint=fingerprint)


def pom_hash(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def libs_current(layout: Layout) -> bool:
    libs = layout.kafka_libs
    try:
        recorded = (libs / POM_HASH_FILE).read_text(encoding="ascii").strip()
    except OSError:
        return False
    return recorded == pom_hash(layout.pom) and any(libs.glob("kafka_2.13-*.jar"))


def ensure_libs(layout: Layout) -> Path:
    """Copy the broker's jars with Maven unless the copy of the current pom is already there."""
    if libs_current(layout):
        return layout.kafka_libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingPrerequisiteError(
            "mvn (Maven)",
            "install Maven 3 (apt-get install maven); it fetches the Kafka jars from Maven Central",
        )
    digest = pom_hash(layout.pom)
    staging = layout.kafka_dir / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    layout.kafka_dir.mkdir(parents=True, exist_ok=True)
    log.info(
        "kafka: fetching the broker jars with Maven (first run, or %s changed)", layout.pom.name
    )
    started = time.monotonic()
    done = subprocess.run(  # noqa: S603 - argv built here from resolved programs
        [
            mvn, "-B", "-q", "-f", str(layout.pom),
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
            "dependency:copy-dependencies",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
        output = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise LocalInfraError(
            f"Maven could not copy the Kafka jars (exit {done.returncode}):\n{output}"
        )
    (staging / POM_HASH_FILE).write_text(digest + "\n", encoding="ascii")
    shutil.rmtree(layout.kafka_libs, ignore_errors=True)
    os.replace(staging, layout.kafka_libs)
    log.info("kafka: jars ready in %.1fs", time.monotonic() - started)
    return layout.kafka_libs


# -- the broker ------------------------------------------------------------------------------
def class_data_archive(kafka_dir: Path, java: JavaRuntime, libs: Path) -> Path:
    """Where the class-data archive of this JVM build and these jars lives (or would)."""
    try:
        jars = (libs / POM_HASH_FILE).read_text(encoding="ascii").strip()
    except OSError:
        jars = "unknown"
    digest = hashlib.sha256(f"{java.fingerprint}:{jars}".encode()).hexdigest()[:16]
    return kafka_dir / f"cds-{digest}.jsa"


class KafkaStorage:
    """The broker's log directory: formatted once (KRaft, this node its only voter)."""

    def __init__(self, layout: Layout, cluster_id: str) -> None:
        self.layout = layout
        self.cluster_id = cluster_id

    def formatted(self) -> bool:
        return (self.layout.kafka_data / "meta.properties").is_file()

    def format(self, tool: list[str], security: KafkaSecurity | None) -> None:
        """Format with the storage tool (`tool`: its java command line), writing the first
        SCRAM credentials of `security` into the cluster metadata."""
        shutil.rmtree(self.layout.kafka_data, ignore_errors=True)
        log.info("kafka: formatting storage (cluster id %s)", self.cluster_id)
        args = [*tool, "format", "-t", self.cluster_id, "-c", str(self.layout.kafka_properties)]
        args.append("--standalone")
        if security is not None:
            args += security.scram_arguments()
        done = subprocess.run(  # noqa: S603 - argv built here from resolved programs
            args, capture_output=True, text=True, check=False, timeout=300, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0 or not self.formatted():
            shutil.rmtree(self.layout.kafka_data, ignore_errors=True)
            raise LocalInfraError(
                f"kafka storage format failed ({done.returncode}):\n{done.stdout}{done.stderr}"
            )


class Kafka:
    heap: tuple[str, ...] = HEAP  # JVM heap flags; a subclass may run a smaller broker

    def __init__(
        self,
        layout: Layout,
        port: int,
        controller_port: int,
        cluster_id: str,
        security: KafkaSecurity | None = None,
        *,
        proxied: tuple[ProxiedListener, ...] = (),
    ) -> None:
        self.layout = layout
        self.config = KafkaConfig(
            port=port,
            controller_port=controller_port,
            log_dir=layout.kafka_data,
            security=security,
            proxied=proxied,
        )
        self.cluster_id = cluster_id
        self.storage = KafkaStorage(layout, cluster_id)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.config.port}"

    def write_config(self) -> bool:
        """Write server.properties and log4j2.xml; True when server.properties changed."""
        self.layout.kafka_logs.mkdir(parents=True, exist_ok=True)
        text = render_server_properties(self.config)
        path = self.layout.kafka_properties
        try:
            changed = path.read_text(encoding="utf-8") != text
        except FileNotFoundError:
            changed = True
        if changed:
            write_atomic(path, text)
        write_atomic(self.layout.kafka_log4j, render_log4j2())
        return changed

    def java_args(self, java: JavaRuntime, libs: Path, main: str) -> list[str]:
        """``java ... -cp <jars> main``: the broker's classpath and logging, for its tools too."""
        logs = self.layout.kafka_logs
        return [
            str(java.path),
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={logs}",
            f"-Dlog4j2.configurationFile={self.layout.kafka_log4j}",
            "-cp",
            f"{libs}/*",
            main,
        ]

    def format(self, java: JavaRuntime, libs: Path) -> None:
        """Format the log directory (the storage tool runs on the broker's jars)."""
        tool = self.java_args(java, libs, "kafka.tools.StorageTool")
        self.storage.format(tool, self.config.security)

    def pid(self) -> int | None:
        """The recorded pid if that process is alive and is this state directory's broker."""
        pid = read_pid(self.layout.kafka_pid)
        if pid is None or not pid_alive(pid):
            return None
        argv = cmdline(pid)
        if MAIN_CLASS not in argv or str(self.layout.kafka_properties) not in argv:
            return None  # the pid was reused by an unrelated process
        return pid

    def class_data_flag(self, java: JavaRuntime, libs: Path) -> str:
        """Use the class-data archive of this JVM and these jars, or have the JVM write it.

        An application class-data (AppCDS) archive halves the broker's start-up on two cores.
        The JVM writes it when it exits cleanly (``down``), under a temporary name that ``stop``
        renames once the process has ended by itself.
        """
        archive = class_data_archive(self.layout.kafka_dir, java, libs)
        if archive.is_file():
            return f"-XX:SharedArchiveFile={archive}"
        for stale in self.layout.kafka_dir.glob("cds-*"):
            stale.unlink(missing_ok=True)
        return f"{ARCHIVE_AT_EXIT}{archive}{PARTIAL}"

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port the broker listens on."""
        ports: tuple[int, ...] = (self.config.port, self.config.controller_port)
        security = self.config.security
        if security is not None:
            ports = (*ports, security.sasl_port, security.ssl_port)
        return (*ports, *(p.port for p in self.config.proxied))

    def start(self, java: JavaRuntime, libs: Path) -> int:
        """Start the broker detached (own session, output to logs/console.log); its pid."""
        taken = [port for port in self.ports if listens(port)]
        if taken:
            raise LocalInfraError(
                f"port(s) {taken} on 127.0.0.1 taken by another process: "
                "set PIN_LOCAL_KAFKA_PORT, or stop that process"
            )
        logs = self.layout.kafka_logs
        args = self.java_args(java, libs, MAIN_CLASS)
        args[1:1] = [
            *self.heap,
            *GC_FLAGS,
            f"-Xlog:gc*:file={logs}/gc.log:time,tags:filecount=3,filesize=10M",
            f"-XX:ErrorFile={logs}/hs_err_pid%p.log",
            self.class_data_flag(java, libs),
        ]
        args.append(str(self.layout.kafka_properties))
        log.info("kafka: starting on %s", self.bootstrap)
        pid = spawn_detached(args, self.layout.kafka_console_log)
        write_atomic(self.layout.kafka_pid, f"{pid}\n")
        return pid

    def answers(self, timeout: float = 3.0) -> bool:
        """Whether the broker answers a metadata request with this state's cluster id."""
        if not listens(self.config.port):
            return False  # nothing listens yet: skip librdkafka's connection-refused noise
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=timeout)
        except KafkaException:
            return False
        # confluent-kafka's stub types ClusterMetadata.cluster_id as None; it is a str.
        cluster_id = cast("str | None", metadata.cluster_id)
        if cluster_id != self.cluster_id:
            raise LocalInfraError(
                f"{self.bootstrap} is another Kafka cluster ({cluster_id}): "
                "set PIN_LOCAL_KAFKA_PORT to a free port"
            )
        return bool(metadata.brokers)

    def wait_answering(self, pid: int, deadline: Deadline) -> None:
        while not self.answers(timeout=min(3.0, max(0.5, deadline.remaining()))):
            if not pid_alive(pid):
                raise LocalInfraError(f"Kafka exited during start-up; {self.log_tails()}")
            if deadline.expired():
                raise LocalInfraError(
                    f"Kafka on {self.bootstrap} does not answer; {self.log_tails()}"
                )
            time.sleep(POLL_INTERVAL)

    def log_tails(self) -> str:
        parts = []
        for path in (self.layout.kafka_console_log, self.layout.kafka_server_log):
            text = tail(path)
            if text:
                parts.append(f"last lines of {path}:\n{text}")
        return "\n".join(parts) or "no log output"

    def stop(self, grace: float = STOP_GRACE) -> bool:
        """SIGTERM, wait ``grace`` seconds, SIGKILL; False when it was not running."""
        pid = self.pid()
        if pid is None:
            self.layout.kafka_pid.unlink(missing_ok=True)
            return False
        log.info("kafka: stopping (pid %d)", pid)
        dumping = [
            a.removeprefix(ARCHIVE_AT_EXIT) for a in cmdline(pid) if a.startswith(ARCHIVE_AT_EXIT)
        ]
        clean = terminate(pid, grace)
        self.layout.kafka_pid.unlink(missing_ok=True)
        for partial in map(Path, dumping):
            if clean and partial.is_file():
                os.replace(partial, partial.with_suffix(""))  # cds-x.jsa.partial -> cds-x.jsa
            else:
                partial.unlink(missing_ok=True)
        return True
