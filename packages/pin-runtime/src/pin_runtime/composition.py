"""The shape every service's composition root has: one way to run a command, one runtime.

- `run_command` maps what a command raises to the process's exit code and ONE line on
  stderr (its last: the command's JSON log lines may precede it), never a traceback that
  could quote a DSN: a bad setting is exit 2 (`config error:
  VARIABLE: reason`, as `settings.settings_or_exit`); a migration refused because a newer
  release migrated the schema is exit 2 too (`error: ...`, nothing changed: the refusal is
  the answer, not a failure to retry); another refused migration or a domain error
  of the service is exit 1 (`error: ...`); a database that cannot be reached is exit 1
  (`error: database unavailable: <first line of the driver's message>`), and so is a
  statement it refused (`error: the database refused the command (SQLSTATE): ...`), and
  anything else a command raises (`error: Type: message`, the traceback in the JSON log);
  a login it refuses (SQLSTATE 28P01/28000, `postgres.auth_failure`; `postgres.check_login`
  at a long-lived command's start) is a bad setting, exit 2 (`config error:
  <PREFIX>DATABASE_DSN: the database refused the login ...`; `<PREFIX>DATABASE_PASSWORD_FILE`
  when the password comes from that file, which `Cli` checks readable as a command starts).
  Every line passes through `settings.redact`. Kafka credentials the brokers refuse are
  exit 2 through `kafka_security.kafka_or_exit`, which each command that talks to Kafka
  calls first.
- `Cli` is each service's command line: one `main` (arguments, settings, logging the same
  way for every command: JSON lines on stderr, so that stdout holds only the command's
  result, a table or the JSON a script reads; a warning for each unknown `<PREFIX>*`
  variable; then `run_command`).
- `long_running` is what a long-lived command (a worker, a relay, a consumer) runs inside:
  JSON logging, tracing, SIGTERM/SIGINT as a stop event, and the ops HTTP server
  (`/metrics`, `/healthz`, `/readyz`): its address taken at once (`Runtime.listen`), its
  answers once the service calls `Runtime.serve` with its readiness checks, its metrics
  by then registered; `Runtime.watch_horizon` starts the command's horizon watch. It exits
  in reverse: ops server, signal handlers, spans flushed.
- `collect_less`: the garbage collector of a process that moves tens of thousands of
  records a second (a relay, a consumer) set once as its command starts.

Nothing here loads a Kafka client: operator commands that never talk to Kafka import it.
"""

from __future__ import annotations

import argparse
import errno
import gc
import logging
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, Generic, NoReturn
from uuid import UUID

import psycopg
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pin_runtime.build import BuildInfo, register_process_metrics
from pin_runtime.errors import MigrationError, NewerSchemaError, SettingsError
from pin_runtime.horizon import HorizonWatch
from pin_runtime.http import Check, Heartbeat, OpsServer
from pin_runtime.logging import LogLevel, configure_logging, log_event
from pin_runtime.metrics import no_created_series
from pin_runtime.postgres import (
    AUTH_FAILURE_SQLSTATES,
    DatabaseAuthError,
    OnRefused,
    SessionLimits,
    auth_failure,
    connect,
    read_password_from,
)
from pin_runtime.secret_files import unreadable_secret_file
from pin_runtime.settings import (
    CONFIG_ERROR_EXIT_CODE,
    S,
    Secret,
    parse_duration,
    redact,
    settings_or_exit,
    unknown_variables,
)
from pin_runtime.shutdown import GracefulShutdown
from pin_runtime.tracing import configure_tracing, shutdown_tracing

__all__ = [
    "COLLECTOR_THRESHOLDS",
    "ERROR_EXIT_CODE",
    "REFUSED_EXIT_CODE",
    "Cli",
    "OneLineArgumentParser",
    "Runtime",
    "collect_less",
    "duration_argument",
    "error_line",
    "long_running",
    "run_command",
    "uuid_argument",
    "whole_number",
]

ERROR_EXIT_CODE: Final = 1
REFUSED_EXIT_CODE: Final = 2
"""A command refused what it was asked, nothing changed: as a bad setting or usage."""

_log = logging.getLogger(__name__)


def uuid_argument(text: str) -> UUID:
    """An argparse `type=` for ids: a UUID, or argparse's usage error (exit 2)."""
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a UUID: {text!r}") from None


def whole_number(least: int, most: int) -> Callable[[str], int]:
    """An argparse `type=`: a whole number from `least` to `most`, else argparse's usage
    error (exit 2), which names the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{value} is out of range: from {least} to {most}")
        return value

    return parse


_UNIT: Final = re.compile(r".*[a-z]\s*$", re.IGNORECASE)


def duration_argument(least: str, most: str) -> Callable[[str], timedelta]:
    """An argparse `type=`: a duration with its unit (`500ms`, `90m`, `30d`) from `least` to
    `most` (written the same way), else argparse's usage error (exit 2). A bare number is
    refused: seconds or milliseconds or days would be a guess, and a wrong one may delete."""
    low, high = parse_duration(least), parse_duration(most)

    def parse(text: str) -> timedelta:
        if not _UNIT.match(text):
            raise argparse.ArgumentTypeError(f"{text!r} has no unit: write e.g. 500ms, 90m or 30d")
        try:
            value = parse_duration(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(
                f"not a duration: {text!r} (e.g. 500ms, 90m or 30d; at most {most})"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: from {least} to {most}")
        return value

    return parse


def error_line(line: str) -> None:
    """One line on stderr, secrets redacted, never wrapped (scripts parse it)."""
    sys.stderr.write(redact(line).replace("\n", " ") + "\n")
    sys.stderr.flush()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_command(
    command: Callable[[], int | None],
    *,
    errors: tuple[type[Exception], ...] = (),
    dsn_variable: str = "DATABASE_DSN",
) -> int:
    """Run `command` and return its exit code (None is 0), the failures above mapped.

    `dsn_variable`: the variable holding the DSN, named when the database refuses the login
    (exit 2, as credentials the brokers refuse: retrying cannot fix a wrong password)."""
    typed: tuple[type[Exception], ...] = (MigrationError, *errors)
    try:
        code = command()
    except SettingsError as exc:
        error_line(f"config error: {exc.variable}: {exc.reason}")
        return CONFIG_ERROR_EXIT_CODE
    except (DatabaseAuthError, psycopg.OperationalError) as exc:
        refused = _refused_login(exc)
        error_line(
            f"error: database unavailable: {_first_line(exc)}"
            if refused is None
            else f"config error: {dsn_variable}: {refused}"
        )
        return ERROR_EXIT_CODE if refused is None else CONFIG_ERROR_EXIT_CODE
    except typed as exc:
        # MigrationError: `migrate` refused (an edited file, roles it may not create); a
        # schema a newer release migrated is refused before anything changed.
        error_line(f"error: {exc}")
        return REFUSED_EXIT_CODE if isinstance(exc, NewerSchemaError) else ERROR_EXIT_CODE
    except psycopg.Error as exc:
        # A statement the database refused (a permission, a constraint, a value it cannot
        # hold): one line with its SQLSTATE for the runbook, never a traceback.
        state = f" ({exc.sqlstate})" if exc.sqlstate else ""
        error_line(f"error: the database refused the command{state}: {_first_line(exc)}")
        return ERROR_EXIT_CODE
    except Exception as exc:
        # A bug, or a failure nothing above names: the traceback goes to the JSON log (for
        # whoever debugs it), one line to stderr (for whoever runs the command).
        _log.error("command failed", exc_info=True)
        error_line(f"error: {type(exc).__name__}: {_first_line(exc)}")
        return ERROR_EXIT_CODE
    return 0 if code is None else code


def _refused_login(exc: Exception) -> str | None:
    """The line for a login PostgreSQL refused (None: the database is unavailable)."""
    if isinstance(exc, DatabaseAuthError):
        return str(exc)
    sqlstate = auth_failure(exc)
    if sqlstate is None:
        return None
    name = AUTH_FAILURE_SQLSTATES[sqlstate]
    return f"the database refused the login ({sqlstate} {name}): {_first_line(exc)}"


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage error is ONE line on stderr, exit 2 (as a bad setting
    is): `PROG COMMAND: error: what is wrong (see PROG COMMAND --help)`, never the usage
    block above it, so that the last line says what went wrong and a script can read it.
    Its sub-parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class Cli(Generic[S]):
    """A service's command line, the same for every service: `main` parses the arguments,
    reads the settings (a bad one: exit 2), configures logging the same way for every
    command, warns about unknown `<PREFIX>*` variables and runs the command under
    `run_command`.

    Every command logs JSON lines to stdout (a long-running one as its whole output, an
    operator command its audit lines and warnings next to what it prints); stderr carries
    only what went wrong: the one `error: ...` line of a failure, a record that could not be
    handled.
    """

    service: str
    settings_type: type[S]
    env_prefix: str
    errors: tuple[type[Exception], ...] = ()
    """The service's own errors: exit 1 with `error: <message>`."""

    def parser(
        self, description: str
    ) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
        """The service's argument parser (`prog` its console script; the help names the
        settings' prefix) and the sub-parsers its commands are added to (`args.command`)."""
        parser: argparse.ArgumentParser = OneLineArgumentParser(
            prog=self.service,
            description=f"{description} Configured by {self.env_prefix}* environment "
            "variables (see the README).",
        )
        parser.add_argument(
            "--version",
            action=_PrintVersion,
            nargs=0,
            default=argparse.SUPPRESS,
            help="print the version, the revision built from, the contracts' version; exit",
        )
        return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def main(
        self,
        parser: argparse.ArgumentParser,
        run: Callable[[argparse.Namespace, S], int | None],
        argv: Sequence[str] | None = None,
        *,
        standalone: Mapping[str, Callable[[argparse.Namespace], int | None]] | None = None,
    ) -> int:
        """Run the command of `argv`. A command of `standalone` reads settings of its own
        instead of the service's (the lag watcher needs no database DSN): it is run under
        `run_command` as it is, and loads, checks and logs its settings itself."""
        args = parser.parse_args(argv)
        own = (standalone or {}).get(args.command)
        if own is not None:
            return run_command(lambda: own(args), errors=self.errors)
        settings = settings_or_exit(self.settings_type, self.env_prefix)
        # Every service's settings carry log_level (the chart's LOG_LEVEL). On stderr: a
        # one-shot command's stdout is its result (a table, or JSON a script parses); a
        # long-running command moves its log to stdout (`long_running`), the pod's log.
        configure_logging(getattr(settings, "log_level", "INFO"), self.service, stream=sys.stderr)
        for variable in unknown_variables(self.settings_type, self.env_prefix):
            log_event(_log, "unknown setting ignored", logging.WARNING, variable=variable)
        password_file = getattr(settings, "database_password_file", None)

        def command() -> int | None:
            _read_password_file(settings, self.env_prefix)
            return run(args, settings)

        return run_command(
            command,
            errors=self.errors,
            # A refused login is the password's fault: where it is set is what to fix.
            dsn_variable=f"{self.env_prefix}DATABASE_"
            + ("PASSWORD_FILE" if password_file else "DSN"),
        )


def _read_password_file(settings: object, prefix: str) -> None:
    """`<PREFIX>DATABASE_PASSWORD_FILE`: one that gives no password is a bad setting (exit 2
    naming it); else every connection to the settings' DSN reads it at its connect, for
    every command, long-running or one-shot (`postgres.read_password_from`)."""
    path = getattr(settings, "database_password_file", None)
    dsn = getattr(settings, "database_dsn", None)
    if not path or not isinstance(dsn, Secret):
        return
    reason = unreadable_secret_file(path)
    if reason is not None:
        raise SettingsError(f"{prefix}DATABASE_PASSWORD_FILE", reason)
    read_password_from(dsn.reveal(), path)


class _PrintVersion(argparse.Action):
    """`--version`: the build's line as it is (argparse's own action wraps it to the
    terminal), exit 0."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(BuildInfo.of(parser.prog).line() + "\n")
        parser.exit(0)


class Runtime:
    """What a long-lived command shares: its registry, heartbeat, ops server and stop signal.

    `stop` is set by the first SIGTERM/SIGINT (or by code: a failing thread stops the
    others); `shutdown` is the same request for loops that poll `shutdown.requested`.
    """

    def __init__(
        self,
        *,
        service: str,
        registry: CollectorRegistry,
        heartbeat: Heartbeat,
        shutdown: GracefulShutdown,
        tracer_provider: trace.TracerProvider,
        host: str,
        port: int,
        env_prefix: str = "",
    ) -> None:
        self.service = service
        self.registry = registry
        self.heartbeat = heartbeat
        self.shutdown = shutdown
        self.tracer_provider = tracer_provider
        self.stop = threading.Event()
        shutdown.add_callback(self.stop.set)
        self.ops = OpsServer(registry=registry, heartbeat=heartbeat)
        self._address = (host, port)
        self._env_prefix = env_prefix

    def listen(self) -> None:
        """Take the ops address, answering nothing yet (`serve` starts answering).

        An address it cannot listen on (taken, not this host's, not resolvable) is the
        metrics settings' fault: `SettingsError`, exit 2 under `run_command`, as the command
        starts and not after the brokers' check has waited out its timeout.
        """
        host, port = self._address
        try:
            self.ops.bind(host, port)
        except OSError as exc:
            # A host no interface has or no name service knows is the host's fault; a port
            # taken or privileged is the port's.
            unknown_host = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
            variable = "METRICS_HOST" if unknown_host else "METRICS_PORT"
            raise SettingsError(
                f"{self._env_prefix}{variable}",
                f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            ) from None

    def serve(self, checks: Mapping[str, Check] | None = None) -> OpsServer:
        """Answer on the ops address with these readiness checks (more may be added later).

        Called once the command's metrics and checks exist: the first `/readyz` that
        answers comes with every check, and a scrape after it with every metric. Requests
        made before wait in the socket's backlog.
        """
        for name, check in (checks or {}).items():
            self.ops.add_check(name, check)
        return self.ops.start()

    def watch_horizon(
        self, dsn: str, session: SessionLimits, *, on_refused: OnRefused | None = None
    ) -> HorizonWatch:
        """Who holds the database's xmin horizon back (`horizon`), polled until `stop` on a
        session of its own named `<service>-horizon`: every long-lived command runs one."""
        watch = HorizonWatch(
            lambda: connect(
                dsn, session, application_name=f"{self.service}-horizon", on_refused=on_refused
            ),
            self.registry,
        )
        watch.start(self.stop)
        return watch


@contextmanager
def long_running(
    service: str,
    *,
    log_level: LogLevel,
    metrics_host: str,
    metrics_port: int,
    heartbeat: Heartbeat,
    registry: CollectorRegistry | None = None,
    env_prefix: str = "",
) -> Iterator[Runtime]:
    """Logging, tracing, signals and the ops server around a long-lived command.

    A bad `OTEL_*` variable raises `SettingsError` here (exit 2 under `run_command`), and so
    does a metrics address `Runtime.serve` cannot listen on (named under `env_prefix`).
    """
    configure_logging(log_level, service)  # stdout: a long-lived process's log is its output
    build = BuildInfo.of(service)
    provider = configure_tracing(service, version=build.version)
    # No `_created` series on /metrics (pin_runtime.metrics says why), whatever imported what.
    no_created_series()
    registry = registry or CollectorRegistry()
    register_process_metrics(registry, build)
    try:
        with GracefulShutdown() as shutdown:
            rt = Runtime(
                service=service,
                registry=registry,
                heartbeat=heartbeat,
                shutdown=shutdown,
                tracer_provider=provider,
                host=metrics_host,
                port=metrics_port,
                env_prefix=env_prefix,
            )
            try:
                rt.listen()
                yield rt
            finally:
                rt.stop.set()
                rt.ops.stop()
    finally:
        shutdown_tracing(provider)


COLLECTOR_THRESHOLDS: Final = (100_000, 50, 100)
"""`collect_less`'s thresholds: the young generation every 100,000 tracked allocations."""


def collect_less(thresholds: tuple[int, int, int] = COLLECTOR_THRESHOLDS) -> None:
    """Freeze what start-up made and collect at `thresholds` (Python's: 700, 10, 10).

    For a process that makes tens of thousands of short-lived objects a second and holds a
    window of them (a relay's rows and delivery callbacks, a consumer's decoded batches):
    with Python's thresholds the collector runs every 700 allocations and walks the window
    and every object of start-up (modules, clients) again and again. Frozen, start-up's
    objects are never walked again; the young generation waits for `thresholds[0]`
    allocations. Their objects form no cycles to speak of, so garbage in cycles waits a
    little longer, bounded by those allocations. Called once, before the command's loop.
    """
    gc.freeze()
    gc.set_threshold(*thresholds)
