-- Shards of a large task: the split, the roll-up onto the task row, the runbook's view.
-- Claiming, fencing, checkpoints, failures and hand-backs of a shard are in units.sql.

-- name: mark_split --
-- The task stays InProgress without a lease of its own: its shards carry the leases. With
-- shard_count > 0 the task claim never takes it as a unit again.
-- user_count: the users the role was split by (the total `tasks show` measures against).
UPDATE identity.access_fanout_tasks
SET shard_count = %(shards)s, user_count = %(users)s, lease_expires_at = NULL,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
  AND shard_count = 0

-- name: mark_whole --
-- A task walked as one unit: the role's users counted by the split's gate (exact, since
-- it had no more than a shard's worth), fenced by the claim like the split.
UPDATE identity.access_fanout_tasks
SET user_count = %(users)s
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
  AND shard_count = 0

-- name: insert_shards --
-- user_count: the users between the shard's bounds at the split (shards.shard_sizes).
INSERT INTO identity.access_fanout_shards
    (id, task_id, shard_no, lower_bound, upper_bound, user_count)
SELECT gen_random_uuid(), %(task_id)s, ord::integer, lower_bound, upper_bound, user_count
FROM unnest(%(lowers)s::uuid[], %(uppers)s::uuid[], %(sizes)s::integer[]) WITH ORDINALITY
    AS b(lower_bound, upper_bound, user_count, ord)

-- name: fail_task --
-- A poisoned shard fails its task: the Failed-task gauge and alert see it as today.
UPDATE identity.access_fanout_tasks
SET status = 'Failed', lease_expires_at = NULL, last_error = %(error)s, updated_at = now()
WHERE id = %(id)s AND status = 'InProgress'

-- name: lock_task --
-- The roll-up onto the task row, last in the batch's transaction so its row lock is held
-- only for the roll-up and the commit. The lock is its own statement: the shard states are
-- read by the next statement, whose snapshot sees every roll-up committed before ours
-- (two shards finishing at once cannot both miss the other's completion).
SELECT status FROM identity.access_fanout_tasks WHERE id = %(id)s FOR UPDATE

-- name: shard_states --
SELECT shard_no, status, lower_bound, cursor, processed_count, attempt_count, lease_expires_at
FROM identity.access_fanout_shards WHERE task_id = %(task_id)s

-- name: task_rollup --
UPDATE identity.access_fanout_tasks
SET processed_count = %(processed)s,
    cursor = %(cursor)s,
    status = %(status)s,
    attempt_count = %(attempts)s,
    lease_expires_at = %(lease)s,
    completed_at = CASE WHEN %(completed)s THEN now() ELSE completed_at END,
    last_error = CASE WHEN %(completed)s THEN NULL ELSE last_error END,
    updated_at = now()
WHERE id = %(id)s
RETURNING created_at, started_at

-- name: select_shards --
-- The shards of a task in range order ({columns}: identity_fanout.fanout.queue.FanOutShard).
SELECT {columns} FROM identity.access_fanout_shards
WHERE task_id = %(task_id)s ORDER BY shard_no

-- name: replay_shards --
-- Replay of a sharded task: its Failed shards start over from their cursors (attempts
-- reset); finished shards are not repeated.
UPDATE identity.access_fanout_shards
SET status = 'Pending', attempt_count = 0, lease_expires_at = NULL, completed_at = NULL,
    updated_at = now()
WHERE task_id = %(task_id)s AND status = 'Failed'

-- name: shard_progress --
-- The shards of the tasks still to finish, by state: `identity-fanout status`.
SELECT s.status, count(*)
FROM identity.access_fanout_shards AS s
JOIN identity.access_fanout_tasks AS t ON t.id = s.task_id
WHERE t.status IN ('Pending', 'InProgress')
GROUP BY s.status
ORDER BY s.status
