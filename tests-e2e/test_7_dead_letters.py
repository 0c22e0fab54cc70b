"""Scenario 7: malformed records in the membership topic go to the DLQ; the flow goes on.

Two malformed records are injected into ``pin.identity.agent-membership-changed.v1`` between
valid changes recorded in identity: bytes that are not JSON, and a well-formed event whose
AgentUserId is Guid.Empty. The running consumer dead-letters both, with the original key,
value and headers and Spring's ``kafka_dlt-*`` headers, and applies what follows.

What "``dlq replay`` after a fix" means here. Replay republishes a dead letter's key, value
and original headers unchanged, so a fix can only be on the consumer's side: a release that
accepts what an earlier release refused. Such an earlier release cannot run in this repository,
so the test stages its leftover: a Left event from a legacy producer that omits Reason and
EffectiveAt (additive fields, ADR-0072) really is on the source topic (before this scenario's
consumer group starts), and its dead letter is written exactly as a release that wrongly
required Reason would have (``$.Payload.Reason`` missing, real original partition/offset/
timestamp). The running, fixed consumer applies it once ``dlq replay --all`` sends it back;
the two records that are still malformed are dead-lettered again, deterministically.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pin_e2e.checks import PlannedChange, rewards_rows
from pin_e2e.poison import Raw, empty_agent_event, membership_event, raw_record
from pin_e2e.report import Recorder
from pin_e2e.steps import projection_converged, record_changes_cli
from pin_e2e.system import System

from pin_contracts import (
    AGENT_MEMBERSHIP_CHANGED,
    IDENTITY_MEMBERSHIP_DLQ,
    REWARDS_MEMBERSHIP_EVENT_INVALID,
    AgentMembershipStatus,
    ContractViolation,
    DeadLetterInfo,
    LeaveReason,
    decode_membership_changed,
    encode,
)
from pin_testkit.private_servers import PrivateServers
from pin_testkit.records import Delivered, Record, produce
from pin_testkit.service import ServiceProcess
from pin_testkit.waiting import wait_until

pytestmark = pytest.mark.integration

VIOLATION_FQCN = f"{ContractViolation.__module__}.{ContractViolation.__qualname__}"


def legacy_left_event(agent: uuid.UUID, agency: uuid.UUID) -> Raw:
    """A Left event as a producer older than ADR-0072 wrote it: no Reason, no EffectiveAt keys."""
    now = datetime.now(UTC)
    envelope = membership_event(
        agent, agency, AgentMembershipStatus.LEFT, left_at=now, joined_at=now - timedelta(days=90)
    )
    document = json.loads(encode(envelope))
    del document["Payload"]["Reason"], document["Payload"]["EffectiveAt"]
    value = json.dumps(document).encode()
    assert decode_membership_changed(value).payload.reason is None  # valid for the contract
    return raw_record(envelope, value)


def dead_letter(record: Record, info: DeadLetterInfo) -> Raw:
    return record.key, record.value, [*record.headers, *info.to_headers()]


def stage_legacy_dead_letter(
    bootstrap: str, make_system: Callable[[str], System]
) -> tuple[System, uuid.UUID, uuid.UUID]:
    """The leftover of the earlier release: the legacy event and its dead letter; the system.

    The event goes to the source topic before the scenario's consumer group starts there, so
    only the replay brings it to this scenario's consumer.
    """
    agent, agency = uuid.uuid4(), uuid.uuid4()
    legacy = legacy_left_event(agent, agency)
    [at] = produce(bootstrap, AGENT_MEMBERSHIP_CHANGED.name, [legacy])
    system = make_system("s7")
    info = DeadLetterInfo(
        error_code=REWARDS_MEMBERSHIP_EVENT_INVALID,
        exception_message="$.Payload: Object missing required field `Reason`",
        exception_fqcn=VIOLATION_FQCN,
        original_topic=AGENT_MEMBERSHIP_CHANGED.name,
        original_partition=at.partition,
        original_offset=at.offset,
        original_timestamp_ms=at.timestamp_ms,
        original_consumer_group=system.group,
        error_path="$.Payload.Reason",
    )
    record = Record(AGENT_MEMBERSHIP_CHANGED.name, at.partition, at.offset, *legacy)
    produce(
        bootstrap,
        IDENTITY_MEMBERSHIP_DLQ.name,
        [dead_letter(record, info)],
        partition=at.partition,
    )
    return system, agent, agency


def dlq_json(system: System, *args: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``rewards-membership dlq <args> --json``: each record's result, and the totals."""
    out = system.rewards_cli("dlq", *args, "--json").stdout
    *records, totals = (json.loads(line) for line in out.splitlines())
    return records, totals


def check_dead_letter(record: Record, original: Raw, at: Delivered, path: str, group: str) -> None:
    """The record byte for byte, its original headers first, then the DLQ headers."""
    key, value, headers = original
    assert (record.key, record.value) == (key, value)
    assert record.headers[: len(headers)] == headers
    assert record.partition == at.partition
    info = DeadLetterInfo.from_headers(record.headers)
    assert info.error_code == REWARDS_MEMBERSHIP_EVENT_INVALID
    assert info.original_topic == AGENT_MEMBERSHIP_CHANGED.name
    assert (info.original_partition, info.original_offset) == (at.partition, at.offset)
    assert info.original_timestamp_ms == at.timestamp_ms
    assert info.original_consumer_group == group
    assert info.exception_fqcn == VIOLATION_FQCN
    assert info.error_path is not None
    assert info.error_path.startswith(path)


def replay_after_the_fix(
    system: System, consumer: ServiceProcess, legacy_agent: uuid.UUID, legacy_agency: uuid.UUID
) -> None:
    """`dlq replay --all` applies what the fixed consumer accepts; `--force` sends the rest."""
    # The fix is deployed (the running consumer accepts a Left without Reason): replay.
    # Records that the same bytes would fail again are refused, each with its reason.
    replayed, _ = dlq_json(system, "replay", "--all")
    assert Counter(r["result"] for r in replayed) == {"replayed": 1, "refused": 2}, replayed
    refused = [r["detail"] for r in replayed if r["result"] == "refused"]
    assert all(detail.startswith("still invalid: ") for detail in refused), refused
    wait_until(
        lambda: bool(rewards_rows(system.rewards_dsn, [legacy_agent])),
        timeout=60,
        what="replayed legacy event applied",
        interval=0.25,
        alive=[consumer],
    )
    row = rewards_rows(system.rewards_dsn, [legacy_agent])[(legacy_agent, legacy_agency)]
    assert (row["status"], row["reason"], row["effective_at"]) == ("Left", None, None)
    assert (row["last_membership_version"], row["applied"]) == (1, 1)
    assert len(system.dlq_records()) == 3  # nothing refused went anywhere

    # Replay is idempotent; --force sends the still-malformed records back, and the
    # consumer dead-letters them again (a new failure, a new dead letter each).
    again_all, _ = dlq_json(system, "replay", "--all", "--force")
    assert Counter(r["result"] for r in again_all) == {"already-replayed": 1, "replayed": 2}, (
        again_all
    )
    wait_until(
        lambda: len(system.dlq_records()) >= 5,
        timeout=60,
        what="still-malformed records dead-lettered again",
        interval=0.25,
        alive=[consumer],
    )


def test_malformed_records_go_to_the_dlq_and_replay_after_a_fix(
    e2e_servers: PrivateServers, make_system: Callable[[str], System], recorder: Recorder
) -> None:
    with recorder.scenario(7, "malformed records -> DLQ, replay after a fix") as stats:
        bootstrap = e2e_servers.services.kafka_bootstrap
        system, legacy_agent, legacy_agency = stage_legacy_dead_letter(bootstrap, make_system)
        worker = system.worker().start()
        consumer = system.consumer().start()
        worker.wait_ready()
        consumer.wait_ready()

        agent_a, agent_b = uuid.uuid4(), uuid.uuid4()
        agency_x, agency_y = uuid.uuid4(), uuid.uuid4()
        projection_matches = projection_converged(system, [agent_a, agent_b])
        record_changes_cli(system, [PlannedChange(agent_a, agency_x, True)])
        wait_until(projection_matches, timeout=60, what="first join applied", alive=[consumer])

        not_json: Raw = (str(uuid.uuid4()).encode(), b'{"MessageId": "unterminated', [])
        empty_agent = empty_agent_event(agency_x)
        injected = produce(bootstrap, AGENT_MEMBERSHIP_CHANGED.name, [not_json, empty_agent])
        stats.fault("a record that is not JSON")
        stats.fault("an event with AgentUserId = Guid.Empty")

        # The flow continues past them.
        record_changes_cli(
            system,
            [
                PlannedChange(agent_a, agency_x, False, reason=LeaveReason.SELF_LEAVE),
                PlannedChange(agent_b, agency_y, True),
            ],
        )
        wait_until(
            lambda: (
                projection_matches()
                and len(rewards_rows(system.rewards_dsn, [agent_a, agent_b])) == 2
                and len(system.dlq_records()) >= 3
            ),
            timeout=60,
            what="changes after the malformed records applied, both dead-lettered",
            interval=0.25,
            alive=[consumer],
        )
        dead = system.dlq_records()
        assert len(dead) == 3, [(r.partition, r.offset) for r in dead]
        by_value = {r.value: r for r in dead}
        check_dead_letter(by_value[not_json[1]], not_json, injected[0], "$", system.group)
        check_dead_letter(
            by_value[empty_agent[1]],
            empty_agent,
            injected[1],
            "$.Payload.AgentUserId",
            system.group,
        )
        listed = system.rewards_cli("dlq", "list", "--json").stdout
        rows = [json.loads(line) for line in listed.splitlines()]
        assert [r["code"] for r in rows] == [REWARDS_MEMBERSHIP_EVENT_INVALID] * 3, rows
        code_key = (
            f'rewards_identity_membership_dlq_total{{code="{REWARDS_MEMBERSHIP_EVENT_INVALID}"}}'
        )
        assert consumer.metrics()[code_key] == 2
        assert rewards_rows(system.rewards_dsn, [legacy_agent]) == {}

        replay_after_the_fix(system, consumer, legacy_agent, legacy_agency)
        seen = {(r.partition, r.offset) for r in dead}
        again = [r for r in system.dlq_records() if (r.partition, r.offset) not in seen]
        assert sorted(r.value or b"" for r in again) == sorted(
            [not_json[1] or b"", empty_agent[1] or b""]
        )
        for record in again:
            info = DeadLetterInfo.from_headers(record.headers)
            assert info.original_topic == AGENT_MEMBERSHIP_CHANGED.name
            assert info.error_code == REWARDS_MEMBERSHIP_EVENT_INVALID
        assert consumer.metrics()[code_key] == 4
        assert projection_matches()  # the replay changed nothing else

        stats.events = len(system.membership_records())
        stats.lost = 0
        stats.notes.append(
            "dead-lettered: not-JSON and Guid.Empty records (again after the replay); "
            "applied after the replay: a legacy Left event without Reason/EffectiveAt"
        )
        assert consumer.terminate() == 0
        assert worker.terminate() == 0
