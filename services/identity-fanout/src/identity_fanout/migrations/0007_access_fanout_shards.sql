-- Shards of a large fan-out task: disjoint UserId ranges of one role, each claimed, leased,
-- fenced and retried on its own so several workers share one large role. The task row stays
-- what operators see (Status, ProcessedCount = sum of the shards, Cursor = low watermark).
-- Small roles never get shard rows.

ALTER TABLE identity.access_fanout_tasks
    ADD COLUMN shard_count integer NOT NULL DEFAULT 0 CHECK (shard_count >= 0);

CREATE TABLE identity.access_fanout_shards (
    id                uuid        PRIMARY KEY,
    task_id           uuid        NOT NULL REFERENCES identity.access_fanout_tasks (id) ON DELETE CASCADE,
    shard_no          integer     NOT NULL CHECK (shard_no >= 1),
    lower_bound       uuid        NOT NULL,  -- exclusive: users after it
    upper_bound       uuid,                  -- inclusive; null: no upper end (the last shard)
    status            text        NOT NULL DEFAULT 'Pending'
                                  CHECK (status IN ('Pending', 'InProgress', 'Completed', 'Failed')),
    cursor            uuid,       -- last UserId fanned out in this shard; null: from lower_bound
    processed_count   integer     NOT NULL DEFAULT 0 CHECK (processed_count >= 0),
    attempt_count     integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    lease_expires_at  timestamptz,
    last_error        text,
    started_at        timestamptz,
    completed_at      timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (task_id, shard_no),
    CHECK (upper_bound IS NULL OR upper_bound > lower_bound)
);

-- The shard claim looks only at live shards, in task then shard order.
CREATE INDEX ix_access_fanout_shards_live
    ON identity.access_fanout_shards (task_id, shard_no)
    WHERE status IN ('Pending', 'InProgress');
