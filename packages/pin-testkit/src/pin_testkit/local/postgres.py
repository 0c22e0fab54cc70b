"""A throwaway PostgreSQL server in the state directory, run with the installed binaries."""

from __future__ import annotations

import glob
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from pin_testkit.local.errors import LocalInfraError, MissingPrerequisiteError
from pin_testkit.local.layout import Layout
from pin_testkit.local.procs import POLL_INTERVAL, Deadline, tail

log = logging.getLogger(__name__)

SUPERUSER = "pin"
MAINTENANCE_DB = "postgres"
DATABASES = ("pin_identity", "pin_rewards")
BINDIR_ENV = "PIN_LOCAL_PG_BINDIR"
CONF_NAME = "pin-local.conf"
PASSWORD_GROUP = "pin_password_auth"  # noqa: S105 - a role's name, no password
"""Roles in this group log in with their password over TCP (scram-sha-256); every other
role is trusted on loopback. Tests of a refused or rotated password make their role a
member (the local cluster trusts everyone else, so a password is never checked)."""
_HBA_NAME = "pg_hba.conf"
_HBA_BLOCK = (
    f"# pin-local: members of {PASSWORD_GROUP} log in with their password\n"
    f"host all +{PASSWORD_GROUP} 127.0.0.1/32 scram-sha-256\n"
    f"host all +{PASSWORD_GROUP} ::1/128 scram-sha-256\n"
)
SERVER_USER = "postgres"  # PostgreSQL refuses to run as root: as root, run it as this user
_SOCKET_PATH_MAX = 107  # sun_path of sockaddr_un, less the terminating NUL
_PG_CTL_NOT_RUNNING = 3
_INSTALL_HINT = "install the PostgreSQL server (apt-get install postgresql) or set " + BINDIR_ENV


@dataclass(frozen=True, slots=True)
class RunAs:
    """The account the server programs run under (None fields: the current user)."""

    uid: int | None = None
    gid: int | None = None

    @property
    def switches(self) -> bool:
        return self.uid is not None


def server_account() -> RunAs:
    if os.geteuid() != 0:
        return RunAs()
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise MissingPrerequisiteError(
            f"system user {SERVER_USER!r}",
            "PostgreSQL cannot run as root; create it (apt-get install postgresql does) "
            "or run pin-local as a normal user",
        ) from None
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


def check_reachable(path: Path, account: RunAs) -> None:
    """Fail clearly when ``account`` cannot traverse every directory above ``path``."""
    if account.uid is None:
        return
    groups = {account.gid}
    for directory in reversed(path.parents):
        info = directory.stat()
        if info.st_uid == account.uid:
            allowed = bool(info.st_mode & stat.S_IXUSR)
        elif info.st_gid in groups:
            allowed = bool(info.st_mode & stat.S_IXGRP)
        else:
            allowed = bool(info.st_mode & stat.S_IXOTH)
        if not allowed:
            raise LocalInfraError(
                f"PostgreSQL runs as user {SERVER_USER!r} (it refuses root), which cannot enter "
                f"{directory} (mode {stat.S_IMODE(info.st_mode):o}): put the state directory "
                "where that user can reach it (PIN_LOCAL_STATE_DIR)"
            )


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path)) or (0,)


def _has_server(bindir: Path) -> bool:
    return all((bindir / prog).is_file() for prog in ("initdb", "pg_ctl", "postgres"))


def find_bindir() -> Path:
    """The PostgreSQL server binaries: $PIN_LOCAL_PG_BINDIR, pg_config, Debian's layout, PATH."""
    override = os.environ.get(BINDIR_ENV, "").strip()
    if override:
        if not _has_server(Path(override)):
            raise MissingPrerequisiteError(
                f"initdb/pg_ctl/postgres in {BINDIR_ENV}={override}", _INSTALL_HINT
            )
        return Path(override)
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run(  # noqa: S603 - argv built here from resolved programs
            [pg_config, "--bindir"], capture_output=True, text=True, check=False, timeout=30
        )
        if done.returncode == 0 and done.stdout.strip():
            candidates.append(Path(done.stdout.strip()))
    candidates += [
        Path(p)
        for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    ]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if _has_server(bindir):
            return bindir
    raise MissingPrerequisiteError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres)", _INSTALL_HINT
    )


def socket_dir_for(layout: Layout, port: int) -> Path | None:
    """The Unix socket directory, or None when the socket path would be too long for the kernel."""
    path = layout.pg_socket_dir / f".s.PGSQL.{port}"
    return layout.pg_socket_dir if len(os.fsencode(path)) <= _SOCKET_PATH_MAX else None


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def render_conf(port: int, socket_dir: Path | None) -> str:
    """The settings pin-local owns, included from postgresql.conf (rewritten at every start)."""
    sockets = "" if socket_dir is None else str(socket_dir)
    lines = [
        "# Written by pin-local at every start; edits are overwritten.",
        "listen_addresses = '127.0.0.1'",
        f"port = {port}",
        f"unix_socket_directories = {_quote(sockets)}",
        "max_connections = 200",
        "# Foreign writers' two-phase transactions are part of what the outbox's history checker",
        "# runs against (PostgreSQL's default of 0 refuses PREPARE TRANSACTION).",
        "max_prepared_transactions = 20",
        "shared_buffers = 128MB",
        "# A throwaway test server: durability against a crash of the MACHINE is traded for",
        "# speed (see infra/local/README.md). A commit still writes its WAL to the operating",
        "# system before it returns, so a crash of PostgreSQL itself (immediate shutdown,",
        "# SIGKILL: the chaos campaign's faults) loses no committed transaction.",
        "fsync = off",
        "synchronous_commit = on",
        "full_page_writes = off",
        "max_wal_size = 1GB",
        "timezone = 'UTC'",
        "log_timezone = 'UTC'",
        "log_min_messages = warning",
        "log_line_prefix = '%m [%p] %q%u@%d '",
    ]
    return "\n".join(lines) + "\n"


def dsn(port: int, database: str = MAINTENANCE_DB) -> str:
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database}"


class Postgres:
    """initdb, start, probe, stop the server of one state directory."""

    def __init__(self, layout: Layout, port: int) -> None:
        self.layout = layout
        self.port = port

    # -- running programs -------------------------------------------------------------------
    def _run(
        self, args: Sequence[str], account: RunAs, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run a server program as ``account`` (the ``postgres`` user when we are root)."""
        return subprocess.run(  # noqa: S603 - argv built here from resolved binaries
            list(args),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd=self.layout.pg_dir,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            user=account.uid,
            group=account.gid,
            extra_groups=[] if account.switches else None,
        )

    def _chown(self, path: Path, account: RunAs) -> None:
        if account.uid is not None and account.gid is not None:
            os.chown(path, account.uid, account.gid)

    # -- lifecycle --------------------------------------------------------------------------
    def initialised(self) -> bool:
        return (self.layout.pg_data / "PG_VERSION").is_file()

    def init(self, bindir: Path, account: RunAs) -> None:
        """Create the cluster once (superuser ``pin``, UTF8, trust on loopback)."""
        pg_dir, data = self.layout.pg_dir, self.layout.pg_data
        check_reachable(pg_dir, account)
        pg_dir.mkdir(parents=True, exist_ok=True)
        pg_dir.chmod(0o700)
        self._chown(pg_dir, account)
        if data.exists():  # a half-made cluster from an interrupted initdb
            shutil.rmtree(data)
        log.info("postgres: initdb %s", data)
        done = self._run(
            [
                str(bindir / "initdb"),
                "-D", str(data),
                "-U", SUPERUSER,
                "--auth-local=trust",
                "--auth-host=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
                "--no-instructions",
            ],
            account,
            timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise LocalInfraError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        with (data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(f"\ninclude_if_exists = '{CONF_NAME}'\n")

    def write_conf(self, account: RunAs) -> bool:
        """Write the owned settings; True when they differ from the ones on disk."""
        sockets = socket_dir_for(self.layout, self.port)
        if sockets is not None:
            sockets.mkdir(exist_ok=True)
            self._chown(sockets, account)
        path = self.layout.pg_data / CONF_NAME
        text = render_conf(self.port, sockets)
        try:
            changed = path.read_text(encoding="utf-8") != text
        except FileNotFoundError:
            changed = True
        if changed:
            path.write_text(text, encoding="utf-8")
            self._chown(path, account)
        return changed

    def write_hba(self) -> bool:
        """Put the password rules of `PASSWORD_GROUP` first in pg_hba.conf (before the
        trust rules); True when they were not there (the server must reload)."""
        path = self.layout.pg_data / _HBA_NAME
        text = path.read_text(encoding="utf-8")
        if text.startswith(_HBA_BLOCK):
            return False
        path.write_text(_HBA_BLOCK + text, encoding="utf-8")  # keeps the file's owner
        return True

    def reload(self) -> None:
        """The server rereads pg_hba.conf (no restart: open sessions stay)."""
        with psycopg.connect(dsn(self.port), autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT pg_reload_conf()")

    def running(self, bindir: Path, account: RunAs) -> bool:
        """Whether the postmaster of this data directory is alive (``pg_ctl status``)."""
        if not self.initialised():
            return False
        done = self._run(
            [str(bindir / "pg_ctl"), "status", "-D", str(self.layout.pg_data)], account, 30
        )
        return done.returncode == 0

    def answers(self, timeout: float = 3.0) -> bool:
        """Whether this data directory's server accepts a connection on the configured port."""
        try:
            with psycopg.connect(dsn(self.port), connect_timeout=max(1, int(timeout))) as conn:
                row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        except psycopg.Error:
            return False
        if row is None:
            return False
        ours = Path(str(row[0])).resolve() == self.layout.pg_data.resolve()
        if not ours:
            raise LocalInfraError(
                f"port {self.port} is served by another PostgreSQL ({row[0]}): "
                "set PIN_LOCAL_PG_PORT to a free port"
            )
        return True

    def start(self, bindir: Path, account: RunAs, deadline: Deadline) -> None:
        log.info("postgres: starting on 127.0.0.1:%d", self.port)
        self.layout.pg_log.touch()
        self._chown(self.layout.pg_log, account)
        seconds = max(5, int(deadline.remaining()))
        done = self._run(
            [
                str(bindir / "pg_ctl"), "start",
                "-D", str(self.layout.pg_data),
                "-l", str(self.layout.pg_log),
                "-w", "-t", str(seconds), "-s",
            ],
            account,
            timeout=seconds + 10,
        )  # fmt: skip
        if done.returncode != 0:
            raise LocalInfraError(
                f"PostgreSQL did not start ({done.stdout.strip()} {done.stderr.strip()}); "
                f"last lines of {self.layout.pg_log}:\n{tail(self.layout.pg_log)}"
            )
        self.wait_answering(deadline)

    def wait_answering(self, deadline: Deadline) -> None:
        while not self.answers():
            if deadline.expired():
                raise LocalInfraError(
                    f"PostgreSQL on 127.0.0.1:{self.port} does not answer; last lines of "
                    f"{self.layout.pg_log}:\n{tail(self.layout.pg_log)}"
                )
            time.sleep(POLL_INTERVAL)

    def stop(
        self, bindir: Path, account: RunAs, timeout: float = 60.0, *, mode: str = "fast"
    ) -> bool:
        """``pg_ctl stop -m <mode>`` (fast, then immediate if that fails; immediate is a
        crash: recovery runs at the next start); False when it was not running."""
        if not self.initialised():
            return False
        pg_ctl, data = str(bindir / "pg_ctl"), str(self.layout.pg_data)
        status = self._run([pg_ctl, "status", "-D", data], account, 30)
        if status.returncode == _PG_CTL_NOT_RUNNING:
            return False
        log.info("postgres: stopping")
        seconds = str(int(timeout))
        done = self._run(
            [pg_ctl, "stop", "-D", data, "-m", mode, "-w", "-t", seconds, "-s"],
            account,
            timeout + 10,
        )
        if done.returncode != 0:
            done = self._run(
                [pg_ctl, "stop", "-D", data, "-m", "immediate", "-w", "-t", seconds, "-s"],
                account,
                timeout + 10,
            )
            if done.returncode != 0:
                raise LocalInfraError(f"pg_ctl stop failed: {done.stdout}{done.stderr}")
        return True

    def create_databases(self, names: Sequence[str] = DATABASES) -> list[str]:
        """Create the missing databases; the names created."""
        created: list[str] = []
        with psycopg.connect(dsn(self.port), autocommit=True, connect_timeout=10) as conn:
            existing = {
                str(r[0]) for r in conn.execute("SELECT datname FROM pg_database").fetchall()
            }
            for name in names:
                if name not in existing:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                    created.append(name)
            # The group the password rules name (pg_hba.conf): created once, no login.
            conn.execute(
                sql.SQL(
                    "DO $$ BEGIN CREATE ROLE {} NOLOGIN;"
                    " EXCEPTION WHEN duplicate_object THEN NULL; END $$"
                ).format(sql.Identifier(PASSWORD_GROUP))
            )
        if created:
            log.info("postgres: created databases %s", ", ".join(created))
        return created
