"""A database login the server refuses, and one whose password rotates: on a real PostgreSQL
whose pg_hba.conf checks the passwords of `pin_password_auth`'s members (pin-local's rule;
every other role is trusted on loopback)."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from psycopg.conninfo import conninfo_to_dict
from relay_support import RelayFactory, RelayThread, access_event, access_topic, outbox_count, write

from identity_fanout.outbox.writer import outbox_message
from pin_runtime.http import ComponentState
from pin_testkit.password_logins import PasswordLogin, password_login
from pin_testkit.ports import free_port
from pin_testkit.service import ServiceProcess, run_cli, service_environment
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

PASSWORD = "first-Secret-1"
ROTATED = "second-Secret-2"
REFUSED = "Wr0ng-Secret-3"


def sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


Login = PasswordLogin


@pytest.fixture
def login(postgres_admin_dsn: str, relay_dsn: str) -> Iterator[Login]:
    with password_login(postgres_admin_dsn, relay_dsn, PASSWORD) as made:
        yield made


@pytest.fixture
def worker_login(postgres_admin_dsn: str, worker_dsn: str) -> Iterator[Login]:
    with password_login(postgres_admin_dsn, worker_dsn, PASSWORD) as made:
        yield made


def logged(stream: io.StringIO, event: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == event]


def test_a_relay_whose_login_is_refused_says_so_counts_it_and_reports_its_gauges_unknown(
    login: Login, make_relay: RelayFactory, json_logs: io.StringIO
) -> None:
    registry = CollectorRegistry()
    state = ComponentState()
    relay = make_relay(dsn=login.dsn(password=REFUSED), registry=registry, state=state)
    with RelayThread(relay):
        wait_until(
            lambda: (sample(registry, "identity_outbox_database_auth_failures_total") or 0) >= 2,
            30,
            "two refused logins counted",
        )
        # Never a healthy 0 for an outbox it could not look at.
        for gauge in (
            "identity_outbox_oldest_age_seconds",
            "identity_outbox_backlog",
            "identity_outbox_writer_oldest_age_seconds",
        ):
            value = sample(registry, gauge)
            assert value is not None, gauge
            assert math.isnan(value), gauge
        check = state()
        assert check.status == "degraded"
        assert "refused the login" in (check.detail or "")
        # The role takes that password now: the next retry logs in, the gauges are read.
        login.rotate(REFUSED)
        wait_until(
            lambda: sample(registry, "identity_outbox_backlog") == 0,
            30,
            "the backlog read again",
        )
        assert sample(registry, "identity_outbox_oldest_age_seconds") == 0
    [first, *_] = logged(json_logs, "database authentication failed")
    assert first["level"] == "ERROR"
    assert first["user"] == login.name
    assert first["host"] == f"127.0.0.1:{conninfo_to_dict(login.base)['port']}"
    assert first["sqlstate"] == "28P01"
    assert REFUSED not in json_logs.getvalue()


@pytest.mark.parametrize("command", ["relay", "worker", "status"])
def test_a_refused_login_at_start_exits_2_naming_the_dsn_variable(
    login: Login, command: str
) -> None:
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=login.dsn(password="wrong-Secret"),
        IDENTITY_FANOUT_KAFKA_BOOTSTRAP=os.environ["PIN_KAFKA_BOOTSTRAP"],
        IDENTITY_FANOUT_METRICS_HOST="127.0.0.1",
        IDENTITY_FANOUT_METRICS_PORT="0",
    )
    result = run_cli("identity-fanout", [command], env, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: IDENTITY_FANOUT_DATABASE_DSN: "), last
    assert "28P01" in last
    assert "wrong-Secret" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr + result.stdout


def test_a_passfile_rewritten_with_a_rotated_password_is_read_at_the_next_connect(
    login: Login,
    identity_dsn: str,
    make_relay: RelayFactory,
    kafka_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    # libpq reads the passfile at every connect: the relay's sessions, killed after the
    # role's password changed, come back with the rewritten file and no restart.
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:{login.name}:{PASSWORD}\n")
    passfile.chmod(0o600)
    topic = access_topic(kafka_topic(partitions=3))
    registry = CollectorRegistry()
    relay = make_relay(dsn=login.dsn(passfile=str(passfile)), registry=registry)
    with RelayThread(relay):
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "first rows published")

        login.rotate(ROTATED)
        passfile.write_text(f"*:*:*:{login.name}:{ROTATED}\n")
        assert login.kill_sessions() >= 1  # the lanes' session at least
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "rows after the rotation")
    assert (sample(registry, "identity_outbox_database_auth_failures_total") or 0) == 0
    assert (sample(registry, "identity_outbox_published_total") or 0) >= 6


def test_a_relay_process_takes_a_rewritten_password_file_without_a_restart(
    login: Login,
    identity_dsn: str,
    kafka_bootstrap: str,
    kafka_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    # IDENTITY_FANOUT_DATABASE_PASSWORD_FILE, group-readable as a Secret volume's file is
    # under the pod's fsGroup (libpq's passfile would be ignored): pin-runtime reads it at
    # every connect, so sessions killed after the rotation come back with the new password.
    secret = tmp_path / "database-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o640)
    topic = access_topic(kafka_topic(partitions=3))
    port = free_port()
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=login.dsn(),
        IDENTITY_FANOUT_DATABASE_PASSWORD_FILE=str(secret),
        IDENTITY_FANOUT_KAFKA_BOOTSTRAP=kafka_bootstrap,
        IDENTITY_FANOUT_METRICS_HOST="127.0.0.1",
        IDENTITY_FANOUT_METRICS_PORT=str(port),
        IDENTITY_FANOUT_RELAY_POLL_INTERVAL="200ms",
    )
    relay = ServiceProcess(
        "relay", "identity-fanout", ("relay",), env, port, tmp_path / "relay.log"
    )
    with relay.start():
        relay.wait_ready()
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        wait_until(lambda: outbox_count(identity_dsn) == 0, 60, "first rows", alive=[relay])

        login.rotate(ROTATED)
        secret.write_text(ROTATED + "\n")
        secret.chmod(0o640)
        assert login.kill_sessions() >= 1  # the lanes' session at least
        write(identity_dsn, [outbox_message(access_event(), topic) for _ in range(3)])
        wait_until(
            lambda: outbox_count(identity_dsn) == 0, 60, "rows after the rotation", alive=[relay]
        )
        relay.assert_running()
        assert relay.metric("identity_outbox_published_total") >= 6
        assert relay.metric("identity_outbox_database_auth_failures_total") == 0
        assert relay.terminate() == 0  # the one run there was, stopped here
    assert PASSWORD not in relay.log_text()
    assert ROTATED not in relay.log_text()


@pytest.mark.parametrize("command", ["relay", "status"])
def test_a_password_file_that_gives_no_password_or_a_refused_one_exits_2_naming_it(
    login: Login, command: str, tmp_path: Path
) -> None:
    secret = tmp_path / "database-password"
    base = {
        "IDENTITY_FANOUT_DATABASE_DSN": login.dsn(),
        "IDENTITY_FANOUT_KAFKA_BOOTSTRAP": os.environ["PIN_KAFKA_BOOTSTRAP"],
        "IDENTITY_FANOUT_METRICS_HOST": "127.0.0.1",
        "IDENTITY_FANOUT_METRICS_PORT": "0",
        "IDENTITY_FANOUT_DATABASE_PASSWORD_FILE": str(secret),
    }
    missing = run_cli(
        "identity-fanout",
        [command],
        service_environment(("IDENTITY_FANOUT_",), **base),
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.strip().splitlines()[-1] == (
        f"config error: IDENTITY_FANOUT_DATABASE_PASSWORD_FILE: cannot read {str(secret)!r}:"
        " No such file or directory"
    )
    secret.write_text("wrong-Secret\n")
    refused = run_cli(
        "identity-fanout",
        [command],
        service_environment(("IDENTITY_FANOUT_",), **base),
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: IDENTITY_FANOUT_DATABASE_PASSWORD_FILE: "), last
    assert "28P01" in last
    assert "wrong-Secret" not in refused.stderr + refused.stdout


def test_a_worker_whose_password_is_rotated_under_it_says_so_counts_it_and_recovers(
    worker_login: Login, kafka_bootstrap: str, tmp_path: Path
) -> None:
    # Its pool's connects are retried out of its loop's sight (a refused one surfaces as a
    # pool timeout), so they are told where they are made: the same line as the relay's.
    secret = tmp_path / "database-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o640)
    port = free_port()
    env = service_environment(
        ("IDENTITY_FANOUT_",),
        IDENTITY_FANOUT_DATABASE_DSN=worker_login.dsn(),
        IDENTITY_FANOUT_DATABASE_PASSWORD_FILE=str(secret),
        IDENTITY_FANOUT_KAFKA_BOOTSTRAP=kafka_bootstrap,
        IDENTITY_FANOUT_METRICS_HOST="127.0.0.1",
        IDENTITY_FANOUT_METRICS_PORT=str(port),
        IDENTITY_FANOUT_POLLING_INTERVAL="200ms",
    )
    counter = "identity_access_fanout_database_auth_failures_total"
    worker = ServiceProcess(
        "worker", "identity-fanout", ("worker", "--no-relay"), env, port, tmp_path / "worker.log"
    )
    with worker.start():
        worker.wait_ready()
        # Exported at 0 from the start: the fan-out's metrics are registered just after the
        # ops server answers, so the first scrape may come a moment before them.
        wait_until(lambda: counter in worker.metrics(), 10, "the counter exported", alive=[worker])
        assert worker.metric(counter) == 0

        worker_login.rotate(ROTATED)  # the file still holds the old password
        assert worker_login.kill_sessions() >= 1
        wait_until(lambda: worker.metric(counter) >= 1, 60, "refused login counted", alive=[worker])
        lines = "\n".join(line for line in worker.log_text().splitlines() if line.startswith("{"))
        [first, *_] = logged(io.StringIO(lines), "database authentication failed")
        assert first["level"] == "ERROR"
        assert first["user"] == worker_login.name
        assert first["host"] == f"127.0.0.1:{conninfo_to_dict(worker_login.base)['port']}"
        assert first["sqlstate"] == "28P01"

        secret.write_text(ROTATED + "\n")
        secret.chmod(0o640)
        wait_until(
            lambda: worker_login.sessions() >= 1 and worker.ready(),
            120,
            "logged in again, ready",
            alive=[worker],
        )
        refused = worker.metric(counter)
        assert worker_login.kill_sessions() >= 1  # the new password is the file's now
        wait_until(lambda: worker_login.sessions() >= 1, 60, "back at once", alive=[worker])
        assert worker.metric(counter) == refused
        assert worker.terminate() == 0
    assert PASSWORD not in worker.log_text()
    assert ROTATED not in worker.log_text()
