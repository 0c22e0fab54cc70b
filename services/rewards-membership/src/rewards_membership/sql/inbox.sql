-- rewards.inbox: the idempotency marks (spec step 1) and the dead-letter marks.
-- A batch looks its keys up and records its marks within ONE statement together with its
-- rows (`apply_batch`, batch.sql); the statements here take binary array parameters (%(x)b).

-- name: select_seen_keys --
-- Which of a batch's keys are in the inbox, for a batch of dead letters only: it has no row
-- or mark to write, so it takes no write lock (`apply_batch`'s INSERTs would, even for no
-- rows: its dead letters would then wait for an inbox another session locked for writes).
SELECT idempotency_key FROM rewards.inbox WHERE idempotency_key = ANY(%(keys)b::text[])

-- name: mark_dead_lettered --
-- Marks of dead letters whose DLQ copy the broker acknowledged. ON CONFLICT: a mark already
-- there (another instance, an earlier try) is the same fact.
INSERT INTO rewards.inbox (idempotency_key, outcome)
SELECT unnest(%(keys)b::text[]), 'dead-lettered'
ON CONFLICT (idempotency_key) DO NOTHING

-- name: count_unreplayed --
-- Dead letters whose mark no replay has cleared yet (partial index).
SELECT count(*) FROM rewards.inbox WHERE outcome = 'dead-lettered'

-- name: select_dead_letter_marks --
-- `dlq list` while Kafka cannot be read: the dead letters pending by their marks, the oldest
-- first (the partial index holds only them).
SELECT idempotency_key, processed_at FROM rewards.inbox
WHERE outcome = 'dead-lettered'
ORDER BY processed_at, idempotency_key
LIMIT %(limit)s

-- name: clear_dead_letter_marks --
-- Before a replay, so the consumer processes the copy again instead of skipping it (a
-- resolved mark too: only a forced replay gets here with one).
DELETE FROM rewards.inbox
WHERE idempotency_key = ANY(%(keys)b::text[])
  AND outcome IN ('dead-lettered', 'dead-letter-resolved')
RETURNING idempotency_key, outcome

-- name: restore_dead_letter_marks --
-- After a replay whose copy the broker did not acknowledge: the record is still a dead
-- letter waiting for an operator (its alert keeps firing, `dlq list` and the gauge agree).
-- ON CONFLICT: a copy that did arrive after all was processed meanwhile; its mark stands.
INSERT INTO rewards.inbox (idempotency_key, outcome)
SELECT * FROM unnest(%(keys)b::text[], %(outcomes)b::text[])
ON CONFLICT (idempotency_key) DO NOTHING

-- name: prune_inbox --
-- One chunk of marks older than the cut-off (chunks keep transactions short). Dead-letter
-- marks stay: they are the dead letters not yet replayed (a replay removes them).
DELETE FROM rewards.inbox
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM rewards.inbox
    WHERE processed_at < %(before)s AND outcome <> 'dead-lettered'
    LIMIT %(limit)s))

-- name: resolve_dead_letter_marks --
-- `dlq resolve`: the open marks among a record's candidate keys become resolved ones (a
-- redelivery stays a skipped duplicate; the unreplayed gauge no longer counts them).
UPDATE rewards.inbox SET outcome = 'dead-letter-resolved'
WHERE idempotency_key = ANY(%(keys)b::text[]) AND outcome = 'dead-lettered'
RETURNING idempotency_key
