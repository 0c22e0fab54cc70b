-- Dead letters an operator resolved without a replay.
--
-- Not every dead letter should go back to the consumer: a record that can never be valid (a
-- producer's bug, a test record, an event superseded by a later one) is dealt with elsewhere
-- and then closed. `dlq resolve` turns the record's 'dead-lettered' inbox mark into
-- 'dead-letter-resolved' (a redelivery stays a skipped duplicate, and the record no longer
-- counts in rewards_identity_membership_dlq_unreplayed, so its alert resolves) and keeps who
-- closed it, when and why here: the audit trail. A later `dlq replay --all` skips it.
ALTER TABLE rewards.inbox DROP CONSTRAINT inbox_outcome_check;
ALTER TABLE rewards.inbox ADD CONSTRAINT inbox_outcome_check
    CHECK (outcome IN ('membership-applied', 'skipped-stale-membership', 'dead-lettered',
                       'dead-letter-resolved'));

CREATE TABLE rewards.dlq_resolutions (
    dlq_topic       text        NOT NULL,
    dlq_partition   integer     NOT NULL,
    dlq_offset      bigint      NOT NULL,
    idempotency_key text        COLLATE "C",  -- the inbox mark it closed (null: none was open)
    reason          text        NOT NULL CHECK (btrim(reason) <> ''),
    resolved_by     text        NOT NULL DEFAULT session_user,
    resolved_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
);
