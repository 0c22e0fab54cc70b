-- A unit of work is a task walked whole or one shard of a large task. Both are claimed,
-- fenced, checkpointed and retried the same way, so their statements are written once,
-- with {unit} the table (identity.access_fanout_tasks or identity.access_fanout_shards),
-- composed at import by identity_fanout.fanout.queue.

-- name: claim --
-- Claim one unit: the {candidate} row, Pending or InProgress with an expired lease.
-- SKIP LOCKED (in the candidate) lets parallel workers pass over a unit another worker is
-- claiming right now. A unit that already had max_attempts claims is not claimed again but
-- marked Failed in the same statement (poison), so it cannot block the queue.
WITH candidate AS (
{candidate}
), poisoned AS (
    SELECT c.*, u.attempt_count >= %(max_attempts)s AS poisoned
    FROM {unit} AS u JOIN candidate AS c USING (id)
)
UPDATE {unit} AS u
SET status = CASE WHEN p.poisoned THEN 'Failed' ELSE 'InProgress' END,
    attempt_count = CASE WHEN p.poisoned THEN u.attempt_count ELSE u.attempt_count + 1 END,
    lease_expires_at = CASE WHEN p.poisoned THEN NULL ELSE now() + %(lease)s END,
    last_error = CASE
        WHEN p.poisoned THEN coalesce(u.last_error, 'lease expired without completing')
        ELSE u.last_error
    END,
    started_at = coalesce(u.started_at, now()),
    updated_at = now()
FROM poisoned AS p
WHERE u.id = p.id
RETURNING {returning}

-- name: task_returning --
-- A claimed task as its walk sees it (identity_fanout.fanout.queue.Unit). Only a task that
-- never started as one unit may be split: a cursor or a count means it had.
u.id, u.attempt_count AS attempt, u.id AS task_id, u.role_id, u.company_id, u.role_version,
u.created_at AS task_created_at, u.started_at AS task_started_at,
p.poisoned, u.last_error,
(u.shard_count = 0 AND u.cursor IS NULL AND u.processed_count = 0) AS splittable

-- name: shard_returning --
-- A claimed shard, with what its batches need of its task (the candidate read it).
u.id, u.attempt_count AS attempt, u.task_id, p.role_id, p.company_id, p.role_version,
p.task_created_at, coalesce(p.task_started_at, p.task_created_at) AS task_started_at,
p.poisoned, u.last_error, u.shard_no, u.lower_bound, u.upper_bound

-- name: task_candidate --
-- The oldest task that is Pending or whose lease expired (its worker died or stalled), not
-- split into shards. The first condition repeats the partial index's predicate so the
-- planner can use it.
SELECT id
FROM identity.access_fanout_tasks
WHERE status IN ('Pending', 'InProgress')
  AND (status = 'Pending' OR lease_expires_at < now())
  AND shard_count = 0
ORDER BY created_at, id
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: shard_candidate --
-- A shard of a live sharded task, with what its batches need from the task (the shard rows
-- are locked, the task rows are not). Fair between tasks: a task's turn is the last time a
-- worker took or finished one of its shards (its creation until then), and the task whose
-- turn is oldest goes first, so tasks share the workers shard by shard instead of a large
-- role holding them all until its last shard. A whole task waiting since before that turn goes first
-- (the claim then takes it as a unit): a small role waits at most for one shard of a large
-- one, whatever the large role's size, and claims stay in CreatedAt order otherwise.
-- fair = false drops that condition: the whole task it yields to is being claimed by
-- another worker right now.
SELECT s.id, t.role_id, t.company_id, t.role_version,
       t.created_at AS task_created_at, t.started_at AS task_started_at
FROM identity.access_fanout_shards AS s
JOIN identity.access_fanout_tasks AS t ON t.id = s.task_id
CROSS JOIN LATERAL (
    SELECT coalesce(max(greatest(x.started_at, x.completed_at)), t.created_at) AS turn
    FROM identity.access_fanout_shards AS x WHERE x.task_id = t.id
) AS served
WHERE s.status IN ('Pending', 'InProgress') AND t.status = 'InProgress'
  AND (s.status = 'Pending' OR s.lease_expires_at < now())
  AND (NOT %(fair)s OR served.turn < coalesce((
      SELECT min(w.created_at) FROM identity.access_fanout_tasks AS w
      WHERE w.status IN ('Pending', 'InProgress')
        AND (w.status = 'Pending' OR w.lease_expires_at < now())
        AND w.shard_count = 0), 'infinity'))
ORDER BY served.turn, t.created_at, s.task_id, s.shard_no
LIMIT 1 FOR UPDATE OF s SKIP LOCKED

-- name: lock_cursor --
-- The fence of a batch: the unit's row, locked, only while this worker's claim is the
-- current one (same attempt_count, still InProgress). No row: the lease was lost to another
-- worker and the batch is rolled back. The cursor is re-read here, never trusted from memory.
SELECT cursor FROM {unit}
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
FOR UPDATE

-- name: checkpoint --
-- The batch checkpoint, fenced like the lock above; it also extends the lease. The last
-- (partial) page completes the unit and clears its lease.
UPDATE {unit}
SET cursor = coalesce(%(cursor)s, cursor),
    processed_count = processed_count + %(count)s,
    status = CASE WHEN %(last)s THEN 'Completed' ELSE status END,
    completed_at = CASE WHEN %(last)s THEN now() ELSE completed_at END,
    lease_expires_at = CASE WHEN %(last)s THEN NULL ELSE now() + %(lease)s END,
    last_error = CASE WHEN %(last)s THEN NULL ELSE last_error END,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
RETURNING processed_count

-- name: record_failure --
-- After a failed batch: keep the reason for the runbook and let the lease run out sooner
-- than MaxLeaseDuration, so the unit is retried in seconds, not minutes. A failure that is
-- not the unit's own (an outage, every batch timing out) gives the claim's attempt back:
-- an outage, however long, never brings a unit closer to poison. The fencing token stays
-- unique: this worker drops the claim now, and the next claim increments it again.
UPDATE {unit}
SET last_error = %(error)s,
    lease_expires_at = least(lease_expires_at, now() + %(retry_in)s),
    attempt_count = attempt_count - CASE WHEN %(counted)s THEN 0 ELSE 1 END,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'

-- name: touch --
-- A worker that waits between batches (the outbox is full) keeps its claim: the lease is
-- extended, fenced like a checkpoint. No row: the claim was lost (or the task superseded).
UPDATE {unit}
SET lease_expires_at = now() + %(lease)s, updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'

-- name: release --
-- Graceful stop between batches: hand the unit back at once instead of making the next
-- worker wait for the lease. The hand-back is not a failed attempt, so the claim's
-- increment is undone; the fencing token (attempt_count) stays unique because nobody else
-- can hold this claim.
UPDATE {unit}
SET status = 'Pending', lease_expires_at = NULL, attempt_count = attempt_count - 1,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
