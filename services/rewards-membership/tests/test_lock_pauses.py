"""Pauses for a row lock held elsewhere, pure: no clock, no broker, no database."""

from __future__ import annotations

import msgspec

from rewards_membership.consumer.partitions import (
    LOCK_TIMEOUT,
    POSTGRESQL,
    PartitionPauser,
    PauseNote,
    pause_note_of,
)


def pauser() -> PartitionPauser:
    return PartitionPauser(initial=1.0, maximum=60.0)


def test_a_lock_pause_is_not_the_database_down_and_is_counted_by_its_reason() -> None:
    p = pauser()
    p.pause(
        0, seek_to=5, dependency=POSTGRESQL, reason="LockNotAvailable", now=0, cause=LOCK_TIMEOUT
    )
    # New partitions are not held, the unreplayed count is still asked: the database answers.
    assert p.down(POSTGRESQL) is None
    p.pause(1, seek_to=7, dependency=POSTGRESQL, reason="OperationalError", now=0)
    down = p.down(POSTGRESQL)
    assert down is not None
    assert down.cause is None
    assert p.by_reason() == {LOCK_TIMEOUT: 1, POSTGRESQL: 1}


def test_a_partition_resumed_after_a_lock_pause_is_a_suspect_until_a_batch_of_it_succeeds() -> None:
    p = pauser()
    p.pause(0, seek_to=5, dependency=POSTGRESQL, reason="lock", now=0, cause=LOCK_TIMEOUT)
    p.pause(1, seek_to=7, dependency=POSTGRESQL, reason="down", now=0)
    assert p.suspects == frozenset()  # paused: not read at all
    p.resume([0, 1])
    assert p.suspects == {0}  # the outage's partition rejoins the batch as usual
    # Failing again keeps its cause and backoff; resumed again, still a suspect.
    p.pause(0, seek_to=5, dependency=POSTGRESQL, reason="lock", now=1, cause=LOCK_TIMEOUT)
    again = p.postpone(0, now=2)
    assert again.cause == LOCK_TIMEOUT
    assert again.attempts == 3
    p.resume([0])
    assert p.suspects == {0}
    p.succeeded([0])
    assert p.suspects == frozenset()
    p.pause(2, seek_to=1, dependency=POSTGRESQL, reason="lock", now=3, cause=LOCK_TIMEOUT)
    p.resume([2])
    p.forget([2])  # revoked: its next owner starts afresh
    assert p.suspects == frozenset()


def test_the_pause_note_carries_the_cause_and_reads_notes_without_one() -> None:
    note = PauseNote(
        paused=POSTGRESQL,
        reason="LockNotAvailable: canceling statement due to lock timeout",
        cause=LOCK_TIMEOUT,
        since=1.0,
        retry_at=2.0,
        attempts=1,
        host="pod-a",
    )
    assert pause_note_of(msgspec.json.encode(note).decode()) == note
    older = '{"paused":"kafka","reason":"x","since":1,"retryAt":2,"attempts":1,"host":"h"}'
    read = pause_note_of(older)
    assert read is not None
    assert read.cause is None
