-- How many users a fan-out task (and each of its shards) has to reach: the total an
-- operator's `tasks show` measures ProcessedCount against (percentage, ETA).
--
-- Expand-only: nullable columns, no default to backfill, nothing the running older version
-- reads or writes changes. A task enqueued (or a shard written) by an older worker keeps
-- NULL, shown as an unknown total.
--
-- Filled where the count is already at hand: a task's at its first claim, by the worker's
-- split decision (the exact count of a small role, the count a large role is split by);
-- each shard's at the split (the users between its bounds at that moment). Users assigned
-- to the role later are still reached (the last shard is open-ended): a count can fall
-- short of ProcessedCount by them.

ALTER TABLE identity.access_fanout_tasks
    ADD COLUMN user_count integer CHECK (user_count IS NULL OR user_count >= 0);

ALTER TABLE identity.access_fanout_shards
    ADD COLUMN user_count integer CHECK (user_count IS NULL OR user_count >= 0);
