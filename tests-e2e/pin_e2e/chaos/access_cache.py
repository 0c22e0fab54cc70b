"""The reference access-cache consumer as a process of the chaos campaign.

Reads `pin.identity.access.v1` from the start offsets it is given (its cache is memory only,
so a restart rebuilds it from the topic, as a consumer of a compacted topic would), applies
every record with `pin_contracts.access_cache.AccessCache`, and appends one line per applied
event, `{"user": ..., "version": ..., "at": <unix time>}`, to its log of applications: the
campaign's measure of when each user's cache was reset. Serves /metrics and /readyz like the
services, so Prometheus scrapes it and the campaign sees it up.

    python -m pin_e2e.chaos.access_cache   (settings in PIN_CHAOS_CACHE_* variables)
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, KafkaError, TopicPartition
from prometheus_client import Counter, start_http_server

from pin_contracts import ContractViolation
from pin_contracts.access_cache import AccessCache, AccessDecision

PREFIX: Final = "PIN_CHAOS_CACHE_"
APPLIED = Counter("pin_access_cache_events_total", "Access events by decision", ["decision"])
MALFORMED = Counter("pin_access_cache_malformed_total", "Records that are not access events")


def main() -> None:
    env = {k.removeprefix(PREFIX): v for k, v in os.environ.items() if k.startswith(PREFIX)}
    start = {int(p): int(o) for p, o in json.loads(env["START"]).items()}
    log_path = Path(env["APPLIED_LOG"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    start_http_server(int(env["METRICS_PORT"]), addr="127.0.0.1")
    consumer = Consumer(
        {
            "bootstrap.servers": env["BOOTSTRAP"],
            "group.id": "pin-chaos-access-cache",  # never commits: assign() with offsets
            "enable.auto.commit": False,
            "reconnect.backoff.max.ms": 1000,
        }
    )
    consumer.assign([TopicPartition(env["TOPIC"], p, o) for p, o in sorted(start.items())])
    cache = AccessCache()
    with log_path.open("a", encoding="utf-8") as log:
        while not stop.is_set():
            messages = consumer.consume(500, timeout=0.5)
            lines = []
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        time.sleep(0.1)  # the broker is away: the client reconnects
                    continue
                try:
                    decision = cache.apply_record(message.value())
                except ContractViolation:
                    MALFORMED.inc()
                    continue
                APPLIED.labels(decision.decision.value).inc()
                if decision.decision is AccessDecision.APPLIED and decision.entry is not None:
                    lines.append(
                        json.dumps(
                            {
                                "user": str(decision.user_id),
                                "version": decision.entry.version,
                                "at": time.time(),
                            }
                        )
                    )
            if lines:
                log.write("\n".join(lines) + "\n")
                log.flush()
    consumer.close()


if __name__ == "__main__":
    main()
