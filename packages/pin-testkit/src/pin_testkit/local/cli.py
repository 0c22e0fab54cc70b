"""``pin-local up|down|status|env``: the local PostgreSQL and Kafka for tests."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from collections.abc import Sequence

from pin_testkit.local.errors import LocalInfraError, MissingPrerequisiteError
from pin_testkit.local.launcher import LocalServices, ServiceStatus, down, ensure_up, status

EXIT_FAILED = 1
EXIT_MISSING = 2
EXIT_NOT_RUNNING = 3
SECURE_HELP = (
    "also a SASL_SSL listener (SCRAM-SHA-512/256) and an SSL listener requiring a client "
    "certificate; kept for later calls"
)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _describe(services: LocalServices, seconds: float) -> str:
    lines = [
        f"local services up in {seconds:.1f}s (state: {services.state_dir})",
        f"  PostgreSQL    {services.postgres_dsn}",
        f"    pin_identity  {services.identity_dsn}",
        f"    pin_rewards   {services.rewards_dsn}",
        "    runtime roles: login <group>_login, password in `pin-local env`",
        f"  Kafka         {services.kafka_bootstrap}",
    ]
    secured = services.secured
    if secured is not None:
        lines += [
            f"    SASL_SSL    {secured.bootstrap} ({secured.mechanism} or SCRAM-SHA-256, "
            f"user {secured.username}; `pin-local env` prints the password)",
            f"    SSL (mTLS)  {secured.mtls_bootstrap} (client certificate "
            f"{secured.tls.client_certificate})",
            f"    CA          {secured.tls.ca_file}",
        ]
    return "\n".join(lines)


def env_lines(services: LocalServices) -> list[str]:
    values = {
        "PIN_POSTGRES_DSN": services.postgres_dsn,
        "PIN_POSTGRES_IDENTITY_DSN": services.identity_dsn,
        "PIN_POSTGRES_REWARDS_DSN": services.rewards_dsn,
        **services.runtime_dsns(),
        "PIN_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
    }
    if services.secured is not None:
        values |= services.secured.exported()
    return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]


def _status_line(service: ServiceStatus) -> str:
    if service.address is None:
        return f"  {service.name:<10} never started"
    state = "up" if service.answering else ("running, not answering" if service.pid else "down")
    pid = f" pid {service.pid}" if service.pid else ""
    return f"  {service.name:<10} {state:<8} {service.address}{pid}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pin-local",
        description="Local PostgreSQL and Kafka for the PIN tests (state in infra/local/.state).",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start or reuse both servers, create databases and topics")
    up.add_argument("--secure", action="store_true", help=SECURE_HELP)
    commands.add_parser("down", help="stop both servers (data is kept)")
    commands.add_parser("status", help="show what runs (exit 3 unless both answer)")
    env = commands.add_parser("env", help="ensure up, then print `export PIN_...=` lines")
    env.add_argument("--secure", action="store_true", help=SECURE_HELP)
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="pin-local: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "up":
            started = time.monotonic()
            services = ensure_up(secure=args.secure)
            _out(_describe(services, time.monotonic() - started))
        elif args.command == "env":
            for line in env_lines(ensure_up(secure=args.secure)):
                _out(line)
        elif args.command == "down":
            down()
            _out("local services stopped")
        else:
            current = status()
            _out(f"state: {current.state_dir}")
            _out(_status_line(current.postgres))
            _out(_status_line(current.kafka))
            return 0 if current.up else EXIT_NOT_RUNNING
    except MissingPrerequisiteError as exc:
        sys.stderr.write(f"pin-local: error: {exc}\n")
        return EXIT_MISSING
    except LocalInfraError as exc:
        sys.stderr.write(f"pin-local: error: {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("pin-local: interrupted\n")
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
