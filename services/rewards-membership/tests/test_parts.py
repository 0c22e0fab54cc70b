"""The pure parts of the consumer loop, without a broker or a database."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import msgspec

from pin_contracts import (
    DLT_VALUE_REPLACED_HEADER,
    EMPTY_GUID,
    MESSAGE_ID_HEADER,
    AgentMembershipChanged,
    DeadLetterInfo,
    Unreadable,
    encode,
    envelope_for,
)
from pin_runtime.settings import Secret
from rewards_membership.consumer.lag import offset_lag
from rewards_membership.consumer.partitions import (
    OffsetLedger,
    PartitionPauser,
    PauseNote,
    pause_note_of,
)
from rewards_membership.dlq.reference import (
    MAX_KEPT_HEADER_BYTES,
    DeadLetterReference,
    decode_reference,
    reference_for,
    reference_headers,
    sha256_hex,
)
from rewards_membership.dlq.resolve import candidate_keys
from rewards_membership.dlq.topic import DeadLetterRecord
from rewards_membership.rules.plan import Outcome, inbox_keys, plan_batch
from rewards_membership.rules.validation import (
    InvalidEvent,
    MembershipChange,
    idempotency_key,
    position_key,
    validate,
)
from rewards_membership.settings import Settings

Event = Callable[..., AgentMembershipChanged]


class TestPartitionPauser:
    def pauser(self) -> PartitionPauser:
        return PartitionPauser(initial=1.0, maximum=60.0)

    def test_a_pause_is_per_partition_and_keeps_its_first_time(self) -> None:
        pauser = self.pauser()
        first = pauser.pause(0, seek_to=10, dependency="kafka", reason="dlq down", now=100.0)
        assert 0.75 <= first.retry_at - 100.0 <= 1.0  # 1 s with subtractive jitter
        assert pauser.paused == frozenset({0})
        assert pauser.due(100.5) == []
        assert pauser.due(101.0) == [0]
        again = pauser.pause(0, seek_to=10, dependency="kafka", reason="dlq down", now=101.0)
        assert again.since == 100.0
        assert 1.5 <= again.retry_at - 101.0 <= 2.0  # the partition's own backoff grows
        assert again.attempts == 2
        assert pauser.paused_for(111.0) == {0: 11.0}

    def test_backoff_grows_to_the_maximum_and_resets_after_a_success(self) -> None:
        pauser = self.pauser()
        now = 0.0
        for _ in range(12):
            pause = pauser.pause(1, seek_to=0, dependency="kafka", reason="x", now=now)
        assert 45.0 <= pause.retry_at - now <= 60.0
        pauser.resume([1])
        assert pauser.paused == frozenset()
        pauser.succeeded([1])
        fresh = pauser.pause(1, seek_to=0, dependency="kafka", reason="x", now=now)
        assert fresh.retry_at - now <= 1.0

    def test_other_partitions_keep_their_own_schedule(self) -> None:
        pauser = self.pauser()
        for _ in range(5):
            pauser.pause(0, seek_to=0, dependency="kafka", reason="x", now=0.0)
        pauser.pause(2, seek_to=7, dependency="kafka", reason="x", now=0.0)
        assert pauser.due(1.0) == [2]

    def test_database_down_holds_new_partitions_until_the_same_retry(self) -> None:
        pauser = self.pauser()
        pause = pauser.pause(0, seek_to=3, dependency="postgresql", reason="down", now=5.0)
        assert pauser.down("kafka") is None
        like = pauser.down("postgresql")
        assert like is pause
        held = pauser.hold(1, like, now=5.5)
        assert (held.retry_at, held.seek_to, held.since) == (pause.retry_at, None, 5.5)
        assert pauser.dependencies() == {"postgresql"}
        postponed = pauser.postpone(0, now=10.0)
        assert postponed.retry_at > 10.0
        assert postponed.seek_to == 3

    def test_forget_drops_pause_and_backoff(self) -> None:
        pauser = self.pauser()
        for _ in range(4):
            pauser.pause(0, seek_to=0, dependency="kafka", reason="x", now=0.0)
        pauser.forget([0])
        assert not pauser.is_paused(0)
        assert pauser.pause(0, seek_to=0, dependency="kafka", reason="x", now=0.0).attempts == 1


class TestOffsetLedger:
    def test_committable_until_committed(self) -> None:
        ledger = OffsetLedger()
        ledger.applied({0: 5, 1: 7})
        ledger.applied({0: 4})  # never backwards
        assert ledger.committable() == {0: 5, 1: 7}
        assert ledger.committable([1, 2]) == {1: 7}
        ledger.committed({1: 7})
        assert ledger.committable() == {0: 5}

    def test_a_later_offset_applied_meanwhile_stays(self) -> None:
        ledger = OffsetLedger()
        ledger.applied({0: 5})
        ledger.applied({0: 9})
        ledger.committed({0: 5})
        assert ledger.committable() == {0: 9}
        ledger.forget([0])
        assert ledger.committable() == {}


def test_offset_lag_from_committed_offsets() -> None:
    assert offset_lag(low=0, high=10, committed=4) == 6
    assert offset_lag(low=3, high=10, committed=-1001) == 7  # no commit yet: from log start
    assert offset_lag(low=0, high=10, committed=12) == 0
    assert offset_lag(low=-1, high=-1, committed=0) is None


def info() -> DeadLetterInfo:
    return DeadLetterInfo(
        error_code="REWARDS_MEMBERSHIP_EVENT_INVALID",
        exception_message="$.Payload.CompanyId: must not be Guid.Empty",
        exception_fqcn="pin_contracts.errors.ContractViolation",
        original_topic="pin.identity.agent-membership-changed.v1",
        original_partition=2,
        original_offset=41,
        original_timestamp_ms=1_700_000_000_000,
        original_consumer_group="pin-rewards-identity-membership",
        error_path="$.Payload.CompanyId",
    )


class TestReference:
    def test_round_trip(self) -> None:
        value = b"x" * 2_000_000
        encoded = reference_for(info(), value, "MSG_SIZE_TOO_LARGE: too large")
        assert len(encoded) < 500
        reference = decode_reference(encoded)
        assert isinstance(reference, DeadLetterReference)
        assert reference.original_partition == 2
        assert reference.original_offset == 41
        assert reference.size == 2_000_000
        assert reference.sha256 == sha256_hex(value)
        assert reference.error.startswith("MSG_SIZE_TOO_LARGE")
        assert b'"originalTopic"' in encoded

    def test_headers_keep_small_originals_and_mark_the_replacement(self) -> None:
        small = [("pin-message-id", b"abc")]
        headers = reference_headers(small, info(), "too-large")
        assert headers[0] == ("pin-message-id", b"abc")
        assert headers[-1] == (DLT_VALUE_REPLACED_HEADER, b"too-large")
        assert DeadLetterInfo.from_headers(headers) == info()
        record = DeadLetterRecord(0, 0, None, None, headers, info())
        assert record.replaced == "too-large"
        assert record.original_headers == small
        huge = [("x-blob", b"y" * (MAX_KEPT_HEADER_BYTES + 1))]
        assert reference_headers(huge, info(), "too-large")[0][0] != "x-blob"

    def test_not_a_reference(self) -> None:
        assert isinstance(decode_reference(b"not json"), Unreadable)
        assert decode_reference(b'{"a":' * 100_000) == Unreadable("JSON nested too deeply")


def test_a_dead_lettered_message_id_is_a_duplicate_before_validation(event: Event) -> None:
    invalid = validate(encode(envelope_for(event(uuid.uuid4(), EMPTY_GUID, 1))))
    assert isinstance(invalid, InvalidEvent)
    assert invalid.key is not None
    unreadable = msgspec.structs.replace(
        InvalidEvent(path="$", reason="not JSON"), key=position_key("t", 1, 5)
    )
    assert inbox_keys([invalid, unreadable]) == [
        invalid.key,
        "rewards:identity-membership:at:t:1:5",
    ]
    # First time: both dead-lettered, keys to mark after the DLQ acknowledged them.
    plan = plan_batch([invalid, unreadable, invalid], set(), {})
    assert plan.outcomes == [Outcome.DEAD_LETTERED, Outcome.DEAD_LETTERED, Outcome.DUPLICATE]
    assert plan.dead_letter_keys == {0: invalid.key, 1: unreadable.key}
    assert plan.inbox == []
    # Redelivered after the marks: duplicates, never a second DLQ copy.
    again = plan_batch([invalid, unreadable], {invalid.key, unreadable.key or ""}, {})
    assert again.outcomes == [Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert again.dead_letter_keys == {}


def test_a_valid_record_with_a_dead_lettered_message_id_is_a_duplicate(event: Event) -> None:
    change = validate(encode(envelope_for(event(uuid.uuid4(), uuid.uuid4(), 1))))
    assert isinstance(change, MembershipChange)
    assert plan_batch([change], {change.key}, {}).outcomes == [Outcome.DUPLICATE]


def test_max_poll_interval_is_above_the_longest_batch() -> None:
    base = Settings(database_dsn=Secret("postgresql://x/y"))
    # 7 statements x 30 s + 2 x (30 s + 5 s) + 60 s
    assert base.max_poll_interval_ms() == (7 * 30 + 2 * 35 + 60) * 1000
    quick = msgspec.structs.replace(
        base, db_statement_timeout=timedelta(seconds=2), delivery_timeout=timedelta(seconds=5)
    )
    assert quick.max_poll_interval_ms() == 300_000  # never below librdkafka's default


class TestResolveCandidateKeys:
    """Which inbox marks `dlq resolve` may close for a dead letter."""

    def record(self, value: bytes | None, *extra: tuple[str, bytes]) -> DeadLetterRecord:
        headers = [*extra, *info().to_headers()]
        return DeadLetterRecord(0, 7, b"k", value, headers, info())

    def test_a_readable_message_id_and_the_position(self, event: Event) -> None:
        # Guid.Empty for CompanyId: invalid, but the MessageId reads.
        envelope = envelope_for(event(uuid.uuid4(), EMPTY_GUID, 1))
        value = encode(envelope)
        keys = candidate_keys(self.record(value), value)
        assert keys == [
            idempotency_key(envelope.message_id),
            position_key("pin.identity.agent-membership-changed.v1", 2, 41),
        ]

    def test_garbage_has_only_its_position(self) -> None:
        record = self.record(b"garbage")
        assert candidate_keys(record, record.value) == [
            position_key("pin.identity.agent-membership-changed.v1", 2, 41)
        ]

    def test_a_gone_original_falls_back_to_the_message_id_header(self) -> None:
        message_id = uuid.uuid4()
        header = (MESSAGE_ID_HEADER, str(message_id).encode())
        keys = candidate_keys(self.record(b"{reference}", header), None)
        assert keys[0] == idempotency_key(message_id)
        malformed = (MESSAGE_ID_HEADER, b"not-a-uuid")
        assert len(candidate_keys(self.record(b"{reference}", malformed), None)) == 1


def test_a_pause_note_reads_back_and_other_metadata_is_not_one() -> None:
    note = PauseNote(
        paused="postgresql",
        reason="connection refused " * 40,
        since=1_796_400_000.5,
        retry_at=1_796_400_060.0,
        attempts=3,
        host="rewards-membership-consumer-7c9f",
    )
    metadata = msgspec.json.encode(note).decode()
    assert len(metadata) < 4096  # the brokers' offset.metadata.max.bytes
    assert '"retryAt"' in metadata  # camelCase on the brokers, as the other wire names
    assert pause_note_of(metadata) == note
    for other in (None, "", "checkpoint 17", '{"paused": 1}', "[]"):
        assert pause_note_of(other) is None
