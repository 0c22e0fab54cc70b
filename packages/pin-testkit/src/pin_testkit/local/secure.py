"""The secured listeners of the local broker (``pin-local up --secure``).

Certificates, keys and the SCRAM user's password are made once and kept in
``<state>/kafka/tls/`` (readable by the owner only), so a reused broker and its clients keep
agreeing on them across ``up`` calls. SCRAM credentials live in the cluster metadata: a storage
formatted in secure mode gets them from ``kafka-storage format --add-scram``; a storage
formatted before secure mode was switched on gets them from ``kafka-configs --alter
--add-config`` (``kafka.admin.ConfigCommand``) once the broker answers.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
from pathlib import Path

from pin_testkit.local.errors import LocalInfraError
from pin_testkit.local.kafka import SCRAM_MECHANISMS, JavaRuntime, Kafka, KafkaSecurity, ScramUser
from pin_testkit.local.layout import Layout
from pin_testkit.local.tls import TlsFiles, write_tls_files
from pin_testkit.secured import SecuredKafka

__all__ = ["add_scram_users", "load_or_create_security", "mark_users_created", "secured_of"]

log = logging.getLogger(__name__)

CREDENTIALS = "credentials.json"
USERS_CREATED = "scram-users.created"
SCRAM_USER = "pin-client"
CONFIG_COMMAND = "kafka.admin.ConfigCommand"


def tls_dir(layout: Layout) -> Path:
    return layout.kafka_dir / "tls"


def load_or_create_security(layout: Layout, sasl_port: int, ssl_port: int) -> KafkaSecurity:
    """The kept TLS files and SCRAM user of this state directory, made at the first call."""
    directory = tls_dir(layout)
    path = directory / CREDENTIALS
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        files = TlsFiles.in_directory(
            directory,
            key_password=str(saved["client_key_password"]),
            principal=str(saved["client_principal"]),
        )
        user = ScramUser(str(saved["scram_user"]), str(saved["scram_password"]))
        missing = [p for p in files.paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(missing)
    except (OSError, ValueError, KeyError, TypeError):
        log.info("kafka: making a CA, certificates and a SCRAM user in %s", directory)
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        files = write_tls_files(directory)
        user = ScramUser(SCRAM_USER, secrets.token_urlsafe(18))
        (directory / USERS_CREATED).unlink(missing_ok=True)  # a new password: users anew
        text = json.dumps(
            {
                "scram_user": user.name,
                "scram_password": user.password,
                "client_key_password": files.client.client_key_password,
                "client_principal": files.client.client_principal,
            },
            indent=2,
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return KafkaSecurity(sasl_port=sasl_port, ssl_port=ssl_port, tls=files, users=(user,))


def users_created(layout: Layout) -> bool:
    return (tls_dir(layout) / USERS_CREATED).is_file()


def mark_users_created(layout: Layout) -> None:
    (tls_dir(layout) / USERS_CREATED).write_text("SCRAM users are in the cluster metadata\n")


def add_scram_users(kafka: Kafka, java: JavaRuntime, libs: Path, security: KafkaSecurity) -> None:
    """Create (or update) every SCRAM user through the running broker's PLAINTEXT listener."""
    # The broker refuses two credentials of one user in one request: one call per mechanism.
    for user in security.users:
        for mechanism in SCRAM_MECHANISMS:
            args = [
                *kafka.java_args(java, libs, CONFIG_COMMAND),
                "--bootstrap-server", kafka.bootstrap,
                "--alter", "--entity-type", "users", "--entity-name", user.name,
                "--add-config", f"{mechanism}=[password={user.password}]",
            ]  # fmt: skip
            done = subprocess.run(  # noqa: S603 - argv built here from resolved programs
                args,
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode != 0:
                output = (done.stdout + done.stderr).replace(user.password, "***")
                raise LocalInfraError(
                    f"creating the SCRAM user {user.name!r} ({mechanism}) failed:\n{output}"
                )
        log.info("kafka: SCRAM user %s created (%s)", user.name, ", ".join(SCRAM_MECHANISMS))


def secured_of(plaintext_bootstrap: str, security: KafkaSecurity) -> SecuredKafka:
    """What a client needs to reach the secured listeners of ``security``."""
    user = security.users[0]
    return SecuredKafka(
        bootstrap=f"127.0.0.1:{security.sasl_port}",
        mtls_bootstrap=f"127.0.0.1:{security.ssl_port}",
        plaintext_bootstrap=plaintext_bootstrap,
        username=user.name,
        password=user.password,
        tls=security.tls.client,
    )
