-- Dead letters in the inbox, and the record of DLQ replays.
--
-- A dead-lettered record is marked in the inbox once the broker acknowledged its DLQ copy,
-- so a redelivery of the same record (a retried batch, a restart before the offset commit)
-- is a skipped-duplicate instead of a second DLQ copy. Its key is the MessageId key; a
-- record whose MessageId cannot be read is keyed by its position
-- ('rewards:identity-membership:at:{topic}:{partition}:{offset}'). `dlq replay` deletes
-- the mark just before it republishes the record, so the replayed copy is processed again.
ALTER TABLE rewards.inbox DROP CONSTRAINT inbox_outcome_check;
ALTER TABLE rewards.inbox ADD CONSTRAINT inbox_outcome_check
    CHECK (outcome IN ('membership-applied', 'skipped-stale-membership', 'dead-lettered'));

-- The dead letters not yet replayed (gauge rewards_identity_membership_dlq_unreplayed,
-- refreshed every few seconds by every consumer): a small partial index, not a scan.
CREATE INDEX ix_inbox_dead_lettered ON rewards.inbox (idempotency_key)
    WHERE outcome = 'dead-lettered';

-- One row per DLQ record republished by `dlq replay`, written after the broker acknowledged
-- the republished copy: a second replay of the same DLQ record is skipped.
CREATE TABLE rewards.dlq_replays (
    dlq_topic        text        NOT NULL,
    dlq_partition    integer     NOT NULL,
    dlq_offset       bigint      NOT NULL,
    idempotency_key  text        COLLATE "C",  -- the inbox mark it cleared (null: none known)
    target_topic     text        NOT NULL,
    target_partition integer     NOT NULL,
    target_offset    bigint      NOT NULL,
    forced           boolean     NOT NULL,
    replayed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
);
