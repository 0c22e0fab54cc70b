"""Pure parts of the local launcher: rendered configuration, layout, catalogue adaptation."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from psycopg.conninfo import conninfo_to_dict

from pin_testkit.local.cli import env_lines
from pin_testkit.local.kafka import (
    KafkaConfig,
    KafkaSecurity,
    ScramUser,
    parse_java_major,
    render_log4j2,
    render_server_properties,
)
from pin_testkit.local.launcher import LocalServices
from pin_testkit.local.layout import POM_RELATIVE, STATE_DIR_ENV, find_repo_root, resolve_layout
from pin_testkit.local.postgres import dsn, render_conf, socket_dir_for
from pin_testkit.local.secure import secured_of
from pin_testkit.local.tls import write_tls_files
from pin_testkit.local.topics import catalogue_topics
from pin_testkit.runtime_roles import LOGIN_PASSWORD
from pin_testkit.secured import SecuredKafka


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return dict(pairs)


def test_server_properties_are_single_node_kraft_on_loopback() -> None:
    props = _properties(
        render_server_properties(
            KafkaConfig(port=29092, controller_port=29093, log_dir=Path("/s/kafka/data"))
        )
    )
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:29093"
    assert props["log.dirs"] == "/s/kafka/data"
    assert props["auto.create.topics.enable"] == "false"
    assert props["num.partitions"] == "3"
    assert props["min.insync.replicas"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"


def test_backslashes_in_paths_are_escaped_for_java_properties() -> None:
    text = render_server_properties(
        KafkaConfig(port=1, controller_port=2, log_dir=Path("/odd\\dir"))
    )
    assert "log.dirs=/odd\\\\dir\n" in text


def test_log4j_configuration_logs_to_a_file_only() -> None:
    xml = render_log4j2()
    assert "${sys:kafka.logs.dir}/server.log" in xml
    assert "Console" not in xml


def test_postgres_settings() -> None:
    conf = render_conf(25432, Path("/s/pg/run"))
    assert "listen_addresses = '127.0.0.1'" in conf
    assert "port = 25432" in conf
    assert "unix_socket_directories = '/s/pg/run'" in conf
    assert "fsync = off" in conf
    # A crash of PostgreSQL itself (the chaos campaign's immediate restart) must not lose a
    # committed transaction that a relay may already have published.
    assert "synchronous_commit = on" in conf
    assert "max_connections = 200" in conf
    assert "unix_socket_directories = ''" in render_conf(1, None)
    assert "'it''s'" in render_conf(1, Path("it's"))


def test_long_state_paths_disable_the_unix_socket(tmp_path: Path) -> None:
    short = resolve_layout(tmp_path)
    assert socket_dir_for(short, 25432) == short.pg_socket_dir
    deep = resolve_layout(tmp_path / ("d" * 120))
    assert socket_dir_for(deep, 25432) is None


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "25" 2025-09-16', 25),
        ('java version "1.8.0_412"', 8),
        ("no version here", None),
    ],
)
def test_java_major_version(output: str, major: int | None) -> None:
    assert parse_java_major(output) == major


def test_repo_root_is_found_above_a_start_directory(tmp_path: Path) -> None:
    (tmp_path / POM_RELATIVE).parent.mkdir(parents=True)
    (tmp_path / POM_RELATIVE).write_text("<project/>", encoding="utf-8")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_repo_root(deep) == tmp_path
    assert find_repo_root(Path("/")) is None


def test_state_dir_variable_overrides_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "elsewhere"))
    layout = resolve_layout()
    assert layout.state_dir == tmp_path / "elsewhere"
    assert layout.pom.is_file()  # this checkout's pom, found from the module file
    monkeypatch.delenv(STATE_DIR_ENV)
    assert resolve_layout().state_dir == layout.pom.parents[1] / ".state"


def test_catalogue_topics_are_the_contract_catalogue() -> None:
    assert catalogue_topics() == [
        ("pin.identity.access.v1", 3, {"max.message.bytes": "8388608"}),
        ("pin.identity.agent-membership-changed.v1", 3, {"max.message.bytes": "1048576"}),
        ("pin.rewards.identity-membership-dlq.v1", 3, {"max.message.bytes": "1048576"}),
    ]


def local_services(secured: SecuredKafka | None = None) -> LocalServices:
    """Local servers on fixed ports (PostgreSQL 25432, Kafka 29092), as `pin-local` records them."""
    return LocalServices(
        postgres_dsn=dsn(25432),
        identity_dsn=dsn(25432, "pin_identity"),
        rewards_dsn=dsn(25432, "pin_rewards"),
        kafka_bootstrap="127.0.0.1:29092",
        pg_port=25432,
        kafka_port=29092,
        state_dir=Path("/s"),
        secured=secured,
    )


def test_env_lines_are_shell_exports() -> None:
    services = local_services()
    lines = env_lines(services)
    assert "export PIN_POSTGRES_DSN=postgresql://pin@127.0.0.1:25432/postgres" in lines
    assert "export PIN_KAFKA_BOOTSTRAP=127.0.0.1:29092" in lines
    assert services.dsn("other") == "postgresql://pin@127.0.0.1:25432/other"
    assert not any("SECURE" in line for line in lines)
    # Every runtime role's login, in its own service's database (what the services run as).
    environ = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines)
    worker = conninfo_to_dict(environ["PIN_POSTGRES_IDENTITY_FANOUT_WORKER_DSN"])
    assert worker["user"] == "identity_fanout_worker_login"
    assert worker["password"] == LOGIN_PASSWORD
    assert worker["dbname"] == "pin_identity"
    consumer = conninfo_to_dict(environ["PIN_POSTGRES_REWARDS_MEMBERSHIP_CONSUMER_DSN"])
    assert (consumer["user"], consumer["dbname"]) == (
        "rewards_membership_consumer_login",
        "pin_rewards",
    )
    assert sum(name.startswith("PIN_POSTGRES_") for name in environ) == 3 + 6 + 1
    both = conninfo_to_dict(
        environ["PIN_POSTGRES_IDENTITY_FANOUT_WORKER_AND_IDENTITY_FANOUT_RELAY_DSN"]
    )
    assert both["user"] == "identity_fanout_worker_and_identity_fanout_relay_login"


def test_env_lines_describe_the_secured_listeners_and_read_back(tmp_path: Path) -> None:
    tls = write_tls_files(tmp_path, client_principal="svc-client")
    security = KafkaSecurity(
        sasl_port=29094, ssl_port=29095, tls=tls, users=(ScramUser("pin-client", "s3 cret"),)
    )
    secured = secured_of("127.0.0.1:29092", security)
    services = local_services(secured=secured)
    lines = env_lines(services)
    assert "export PIN_KAFKA_SECURE_BOOTSTRAP=127.0.0.1:29094" in lines
    assert "export PIN_KAFKA_MTLS_BOOTSTRAP=127.0.0.1:29095" in lines
    assert "export PIN_KAFKA_SASL_PASSWORD='s3 cret'" in lines
    environ = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines)
    assert SecuredKafka.from_environment(environ) == secured
    assert secured.tls.client_principal == "svc-client"
    assert "s3 cret" not in repr(secured)
    assert SecuredKafka.from_environment({}) is None
    with pytest.raises(ValueError, match="PIN_KAFKA_SASL_PASSWORD"):
        SecuredKafka.from_environment(
            {k: v for k, v in environ.items() if k != "PIN_KAFKA_SASL_PASSWORD"}
        )


def test_secured_broker_adds_sasl_ssl_and_mutual_tls_listeners(tmp_path: Path) -> None:
    tls = write_tls_files(tmp_path)
    security = KafkaSecurity(
        sasl_port=29094, ssl_port=29095, tls=tls, users=(ScramUser("pin-client", "s3cret"),)
    )
    props = _properties(
        render_server_properties(
            KafkaConfig(port=29092, controller_port=29093, log_dir=Path("/s/d"), security=security)
        )
    )
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093,"
        "SASL_SSL://127.0.0.1:29094,SSL://127.0.0.1:29095"
    )
    assert props["listener.security.protocol.map"].endswith(",SASL_SSL:SASL_SSL,SSL:SSL")
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,SCRAM-SHA-256"
    assert props["listener.name.ssl.ssl.client.auth"] == "required"
    assert props["ssl.keystore.location"] == str(tls.broker_keystore)
    assert props["ssl.truststore.location"] == str(tls.client.ca_file)
    assert "s3cret" not in render_server_properties(
        KafkaConfig(port=1, controller_port=2, log_dir=Path("/d"), security=security)
    )  # SCRAM credentials go into the metadata at format time, never into a file
    assert security.scram_arguments() == [
        "--add-scram",
        "SCRAM-SHA-512=[name=pin-client,password=s3cret]",
        "--add-scram",
        "SCRAM-SHA-256=[name=pin-client,password=s3cret]",
    ]
    assert "s3cret" not in repr(security)


def test_tls_files_chain_to_their_ca(tmp_path: Path) -> None:
    tls = write_tls_files(tmp_path)
    ca = x509.load_pem_x509_certificate(tls.client.ca_file.read_bytes())
    client = x509.load_pem_x509_certificate(tls.client.client_certificate.read_bytes())
    broker = x509.load_pem_x509_certificates(tls.broker_keystore.read_bytes())
    client.verify_directly_issued_by(ca)
    broker[0].verify_directly_issued_by(ca)
    names = broker[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert client.subject.rfc4514_string().startswith("CN=pin-client")
    assert (tls.client.client_key.stat().st_mode & 0o777) == 0o600
    assert b"ENCRYPTED PRIVATE KEY" in tls.client.client_key.read_bytes()
    other = write_tls_files(tmp_path / "other")
    with pytest.raises(InvalidSignature):  # same CA name, another key
        client.verify_directly_issued_by(
            x509.load_pem_x509_certificate(other.client.ca_file.read_bytes())
        )
