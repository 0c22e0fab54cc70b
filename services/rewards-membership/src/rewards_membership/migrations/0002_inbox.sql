-- Idempotency marks of consumed messages: key 'rewards:identity-membership:{MessageId}'.
-- Written in the same transaction as the projection change (or alone on a skip). Pruned by
-- `rewards-membership inbox prune --older-than`: replay stays safe by the version guard alone.

CREATE TABLE rewards.inbox (
    idempotency_key  text        PRIMARY KEY,
    outcome          text        NOT NULL
                     CHECK (outcome IN ('membership-applied', 'skipped-stale-membership')),
    processed_at     timestamptz NOT NULL DEFAULT now()
);

-- Rows arrive in processed_at order, so a BRIN index serves the prune at almost no write cost.
CREATE INDEX ix_inbox_processed_at ON rewards.inbox USING brin (processed_at);
