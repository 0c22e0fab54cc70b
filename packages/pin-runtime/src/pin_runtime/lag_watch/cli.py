"""The `lag-watch` command of a service's CLI.

It reads its own settings (`LagWatchSettings` of the service, under the service's prefix),
not the service's: the watcher talks to Kafka only, so its pod needs no database DSN. The
Kafka client is loaded when the command runs (`app`), never when the CLI starts, so the
service's operator commands stay free of librdkafka.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from pin_runtime.lag_watch.settings import LagWatchSettings
from pin_runtime.settings import settings_or_exit

__all__ = ["COMMAND", "LagWatchCommand"]

COMMAND: Final = "lag-watch"

L = TypeVar("L", bound=LagWatchSettings)


@dataclass(frozen=True)
class LagWatchCommand(Generic[L]):
    """`<service> lag-watch`: added to the service's parser by `add_to`, run by calling it
    (`Cli.main(..., standalone={COMMAND: command})`)."""

    service: str
    settings_type: type[L]
    env_prefix: str

    def add_to(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        commands.add_parser(
            COMMAND,
            help="export the lag of consumer groups as the brokers see it, until SIGTERM "
            f"({self.env_prefix}LAG_WATCH_* settings)",
        )

    def __call__(self, _args: argparse.Namespace) -> None:
        settings = settings_or_exit(self.settings_type, self.env_prefix)
        from pin_runtime.lag_watch import app  # noqa: PLC0415 - loads the Kafka client

        app.run_lag_watch(self.service, self.env_prefix, settings)
