"""A consumer of `pin.identity.access.v1` to start from: a confluent-kafka loop feeding the
reference access cache (`pin_contracts.access_cache.AccessCache`), the way the spec asks a
consumer (crm, catalog, chessboard, gateway) to read the topic.

- **At-least-once.** Offsets are committed after the records are applied, never before; a
  redelivery carries the same (UserId, Version) and is `skipped-duplicate`.
- **Per-user order.** The key is the UserId, so one user's events arrive in order on one
  partition; the cache needs no locks as long as one thread owns it.
- **Refused records are not dropped silently.** A value that is not the contract raises
  `ContractViolation`: logged with its place here; a service dead-letters it (as
  rewards-membership does) and goes on.
- **Fail closed.** An empty snapshot is "no access"; an event the cache cannot order or
  enforce invalidates the user: reload that user's access from identity before authorizing.

    python contracts/examples/access_consumer.py --bootstrap host:9092 --group my-service-access

Needs `pin-contracts` and `confluent-kafka`. Copy it into the consumer's own code base and
replace the log lines with its logger, its DLQ and its reload of invalidated users.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Message

from pin_contracts import USER_ACCESS_CHANGED, ContractViolation
from pin_contracts.access_cache import AccessCache, AccessDecision, Decision

log = logging.getLogger("access-consumer")


@dataclass
class AccessConsumer:
    """The loop: poll a batch, apply each record to the cache, commit, repeat."""

    consumer: Consumer
    cache: AccessCache = field(default_factory=AccessCache)
    on_invalidated: Callable[[Decision], None] = lambda decision: None
    """Called for a user whose entry was dropped: reload their access from identity."""
    batch_size: int = 500
    refused: int = 0

    def poll_once(self, timeout: float = 1.0) -> list[Decision]:
        """One batch: the decisions of its valid records, in order (offsets committed)."""
        messages = self.consumer.consume(num_messages=self.batch_size, timeout=timeout)
        decisions = []
        for message in messages:
            if message.error() is not None:
                log.warning("consume error: %s", message.error())
                continue
            decision = self._apply(message)
            if decision is not None:
                decisions.append(decision)
        if messages:
            # After applying: a crash before this line redelivers the batch (deduplicated).
            self.consumer.commit(asynchronous=False)
        return decisions

    def _apply(self, message: Message) -> Decision | None:
        try:
            decision = self.cache.apply_record(message.value())
        except ContractViolation as exc:
            self.refused += 1
            log.error(  # noqa: TRY400 - the record's fault, not this code's: no traceback
                "refused record %s[%s]@%s: %s",
                message.topic(),
                message.partition(),
                message.offset(),
                exc,
            )
            return None
        if decision.decision is AccessDecision.INVALIDATED:
            self.on_invalidated(decision)
        log.info("%s user %s: %s", decision.decision, decision.user_id, decision.why)
        return decision


def consumer_config(bootstrap: str, group: str) -> dict[str, str | bool]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        # Committed by the loop, after the records are applied.
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        # The identity relay writes in transactions' order; read only what it committed.
        "isolation.level": "read_committed",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    kafka = Consumer(consumer_config(args.bootstrap, args.group))
    kafka.subscribe([USER_ACCESS_CHANGED.name])
    loop = AccessConsumer(kafka)
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while running:
            loop.poll_once()
    finally:
        kafka.close()  # leaves the group; everything applied was committed


if __name__ == "__main__":
    main()
