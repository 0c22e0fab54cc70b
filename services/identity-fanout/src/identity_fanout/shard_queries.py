"""Every SQL statement of the sharded fan-out, named. Parameters are always bound."""

from __future__ import annotations

from typing import Final

from identity_fanout.shards import SHARD_COLUMNS

# The split gate: only "more than ShardSize users or not" matters, so it stops there. A
# small role costs one short index-only scan, once per task.
COUNT_USERS_UP_TO: Final = """
SELECT count(*) FROM (
    SELECT DISTINCT user_id FROM identity.role_assignments
    WHERE role_id = %(role_id)s AND status = 'Active'
    LIMIT %(limit)s
) AS users
"""

COUNT_USERS: Final = """
SELECT count(DISTINCT user_id) FROM identity.role_assignments
WHERE role_id = %(role_id)s AND status = 'Active'
"""

# The inner shard bounds: every `step`-th of the role's distinct users in UserId order, so
# the shards hold about equal numbers of users. The index-only scan already yields them in
# order: numbering them costs no sort (percentile_disc would sort them all).
SPLIT_BOUNDS: Final = """
SELECT user_id FROM (
    SELECT user_id, row_number() OVER (ORDER BY user_id) AS rn
    FROM (
        SELECT DISTINCT user_id FROM identity.role_assignments
        WHERE role_id = %(role_id)s AND status = 'Active'
    ) AS users
) AS numbered
WHERE rn %% %(step)s = 0
ORDER BY rn
LIMIT %(bounds)s
"""

# The task stays InProgress without a lease of its own: its shards carry the leases. With
# shard_count > 0 the task claim never takes it as a unit again.
MARK_SPLIT: Final = """
UPDATE identity.access_fanout_tasks
SET shard_count = %(shards)s, lease_expires_at = NULL, updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
  AND shard_count = 0
"""

INSERT_SHARDS: Final = """
INSERT INTO identity.access_fanout_shards (id, task_id, shard_no, lower_bound, upper_bound)
SELECT gen_random_uuid(), %(task_id)s, ord::integer, lower_bound, upper_bound
FROM unnest(%(lowers)s::uuid[], %(uppers)s::uuid[]) WITH ORDINALITY
    AS b(lower_bound, upper_bound, ord)
"""

_RETURNING: Final = ", ".join("s." + column for column in SHARD_COLUMNS)

# Claim one shard of a live sharded task, oldest task first, like the task claim: Pending
# or with an expired lease, SKIP LOCKED past shards being claimed right now. A shard that
# had max_attempts claims is marked Failed instead (poison; the caller fails its task).
CLAIM_SHARD: Final = f"""
WITH candidate AS (
    SELECT s.id
    FROM identity.access_fanout_shards AS s
    JOIN identity.access_fanout_tasks AS t ON t.id = s.task_id
    WHERE s.status IN ('Pending', 'InProgress')
      AND (s.status = 'Pending' OR s.lease_expires_at < now())
      AND t.status = 'InProgress'
    ORDER BY t.created_at, s.task_id, s.shard_no
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
), poisoned AS (
    SELECT s.id, s.attempt_count >= %(max_attempts)s AS poisoned
    FROM identity.access_fanout_shards AS s JOIN candidate USING (id)
)
UPDATE identity.access_fanout_shards AS s
SET status = CASE WHEN p.poisoned THEN 'Failed' ELSE 'InProgress' END,
    attempt_count = CASE WHEN p.poisoned THEN s.attempt_count ELSE s.attempt_count + 1 END,
    lease_expires_at = CASE WHEN p.poisoned THEN NULL ELSE now() + %(lease)s END,
    last_error = CASE
        WHEN p.poisoned THEN coalesce(s.last_error, 'lease expired without completing')
        ELSE s.last_error
    END,
    started_at = coalesce(s.started_at, now()),
    updated_at = now()
FROM poisoned AS p, identity.access_fanout_tasks AS t
WHERE s.id = p.id AND t.id = s.task_id
RETURNING {_RETURNING}, t.role_id, t.company_id, t.role_version
"""

# A poisoned shard fails its task: the Failed-task gauge and alert see it as today.
FAIL_TASK: Final = """
UPDATE identity.access_fanout_tasks
SET status = 'Failed', lease_expires_at = NULL, last_error = %(error)s, updated_at = now()
WHERE id = %(id)s AND status = 'InProgress'
"""

# The fence of a shard batch, and its checkpoint (the cursor is re-read, never trusted).
LOCK_SHARD: Final = """
SELECT cursor FROM identity.access_fanout_shards
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
FOR UPDATE
"""

# One page of the shard's users: after the cursor, up to the shard's upper bound.
PAGE_SHARD_USERS: Final = """
SELECT DISTINCT user_id
FROM identity.role_assignments
WHERE role_id = %(role_id)s AND status = 'Active' AND user_id > %(after)s
  AND (%(upper)s::uuid IS NULL OR user_id <= %(upper)s::uuid)
ORDER BY user_id
LIMIT %(limit)s
"""

SHARD_CHECKPOINT: Final = """
UPDATE identity.access_fanout_shards
SET cursor = coalesce(%(cursor)s, cursor),
    processed_count = processed_count + %(count)s,
    status = CASE WHEN %(last)s THEN 'Completed' ELSE status END,
    completed_at = CASE WHEN %(last)s THEN now() ELSE completed_at END,
    lease_expires_at = CASE WHEN %(last)s THEN NULL ELSE now() + %(lease)s END,
    last_error = CASE WHEN %(last)s THEN NULL ELSE last_error END,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
RETURNING processed_count
"""

# The roll-up onto the task row, last in the batch's transaction so its row lock is held
# only for the roll-up and the commit. The lock is its own statement: the shard states are
# read by the next statement, whose snapshot sees every roll-up committed before ours
# (two shards finishing at once cannot both miss the other's completion).
LOCK_TASK: Final = """
SELECT status FROM identity.access_fanout_tasks WHERE id = %(id)s FOR UPDATE
"""

SHARD_STATES: Final = """
SELECT shard_no, status, lower_bound, cursor, processed_count
FROM identity.access_fanout_shards WHERE task_id = %(task_id)s
"""

TASK_ROLLUP: Final = """
UPDATE identity.access_fanout_tasks
SET processed_count = %(processed)s,
    cursor = %(cursor)s,
    status = %(status)s,
    completed_at = CASE WHEN %(completed)s THEN now() ELSE completed_at END,
    last_error = CASE WHEN %(completed)s THEN NULL ELSE last_error END,
    updated_at = now()
WHERE id = %(id)s
RETURNING created_at, started_at
"""

SHARD_FAILURE: Final = """
UPDATE identity.access_fanout_shards
SET last_error = %(error)s,
    lease_expires_at = least(lease_expires_at, now() + %(retry_in)s),
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
"""

RELEASE_SHARD: Final = """
UPDATE identity.access_fanout_shards
SET status = 'Pending', lease_expires_at = NULL, attempt_count = attempt_count - 1,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
"""

SELECT_SHARDS: Final = f"""
SELECT {", ".join(SHARD_COLUMNS)} FROM identity.access_fanout_shards
WHERE task_id = %(task_id)s ORDER BY shard_no
"""

# Replay of a sharded task: its Failed shards start over from their cursors (attempts
# reset); the task returns to InProgress, the state whose shards are claimable (Pending
# would let the task claim take it as one unit).
REPLAY_SHARDS: Final = """
UPDATE identity.access_fanout_shards
SET status = 'Pending', attempt_count = 0, lease_expires_at = NULL, completed_at = NULL,
    updated_at = now()
WHERE task_id = %(task_id)s AND status = 'Failed'
"""

REPLAY_SHARDED_TASK: Final = """
UPDATE identity.access_fanout_tasks
SET status = 'InProgress', attempt_count = 0, lease_expires_at = NULL, completed_at = NULL,
    updated_at = now()
WHERE id = %(id)s AND status = 'Failed' AND shard_count > 0
"""
