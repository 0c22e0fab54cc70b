"""Every SQL statement of the fan-out, named. Parameters are always bound, never formatted."""

from __future__ import annotations

from typing import Final

TASK_COLUMNS: Final = (
    "id",
    "role_id",
    "company_id",
    "role_version",
    "reason",
    "status",
    "cursor",
    "processed_count",
    "attempt_count",
    "lease_expires_at",
    "last_error",
    "created_at",
    "started_at",
    "completed_at",
    "updated_at",
    "shard_count",
)

# Claim one task: the oldest Pending one, or an InProgress one whose lease expired (its
# worker died or stalled). SKIP LOCKED lets parallel workers pass over a task another worker
# is claiming right now. A task that already had max_attempts claims is not claimed again
# but marked Failed in the same statement (poison), so it cannot block the queue.
# The first condition repeats the partial index's predicate so the planner can use it.
CLAIM_TASK: Final = f"""
WITH candidate AS (
    SELECT id
    FROM identity.access_fanout_tasks
    WHERE status IN ('Pending', 'InProgress')
      AND (status = 'Pending' OR lease_expires_at < now())
      AND shard_count = 0
    ORDER BY created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), poisoned AS (
    SELECT t.id, t.attempt_count >= %(max_attempts)s AS poisoned
    FROM identity.access_fanout_tasks t JOIN candidate USING (id)
)
UPDATE identity.access_fanout_tasks AS t
SET status = CASE WHEN p.poisoned THEN 'Failed' ELSE 'InProgress' END,
    attempt_count = CASE WHEN p.poisoned THEN t.attempt_count ELSE t.attempt_count + 1 END,
    lease_expires_at = CASE WHEN p.poisoned THEN NULL ELSE now() + %(lease)s END,
    last_error = CASE
        WHEN p.poisoned THEN coalesce(t.last_error, 'lease expired without completing')
        ELSE t.last_error
    END,
    started_at = coalesce(t.started_at, now()),
    updated_at = now()
FROM poisoned AS p
WHERE t.id = p.id
RETURNING {", ".join("t." + column for column in TASK_COLUMNS)}
"""

# One page of the role's users: distinct UserIds of Active assignments after the cursor.
# Served by ix_role_assignments_role_active_user as an index-only scan.
PAGE_USERS: Final = """
SELECT DISTINCT user_id
FROM identity.role_assignments
WHERE role_id = %(role_id)s AND status = 'Active' AND user_id > %(after)s
ORDER BY user_id
LIMIT %(limit)s
"""

# Every Active, unexpired assignment of a page of users, with the role code: the snapshot of
# each user in one query (no N+1). An assignment whose ExpiresAt has passed is left out even
# before the expiry job marks it Expired: the snapshot must never extend access.
SNAPSHOT_ROWS: Final = """
SELECT a.user_id, a.id, a.role_id, r.code, a.company_id, a.scope_type,
       a.scope_organization_id, a.scope_project_group_id, a.scope_project_id, a.expires_at
FROM identity.role_assignments AS a
JOIN identity.role_definitions AS r ON r.id = a.role_id
WHERE a.user_id = ANY(%(user_ids)s)
  AND a.status = 'Active'
  AND (a.expires_at IS NULL OR a.expires_at > now())
ORDER BY a.user_id, a.id
"""

# The batch checkpoint, fenced: it matches only while this worker's claim is the current one
# (same attempt_count, still InProgress). Zero rows means the lease was lost to another
# worker: the caller rolls the whole batch back. Each checkpoint also extends the lease.
CHECKPOINT: Final = """
UPDATE identity.access_fanout_tasks
SET cursor = coalesce(%(cursor)s, cursor),
    processed_count = processed_count + %(count)s,
    status = CASE WHEN %(last)s THEN 'Completed' ELSE status END,
    completed_at = CASE WHEN %(last)s THEN now() ELSE completed_at END,
    lease_expires_at = CASE WHEN %(last)s THEN NULL ELSE now() + %(lease)s END,
    last_error = CASE WHEN %(last)s THEN NULL ELSE last_error END,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
RETURNING processed_count, created_at
"""

# After a failed batch: keep the reason for the runbook and let the lease run out sooner
# than MaxLeaseDuration, so a transient failure is retried in seconds, not minutes.
RECORD_FAILURE: Final = """
UPDATE identity.access_fanout_tasks
SET last_error = %(error)s,
    lease_expires_at = least(lease_expires_at, now() + %(retry_in)s),
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
"""

# Graceful stop between batches: hand the task back at once instead of making the next
# worker wait for the lease. The hand-back is not a failed attempt, so the claim's
# increment is undone; the fencing token (attempt_count) stays unique because nobody else
# can hold this claim.
RELEASE: Final = """
UPDATE identity.access_fanout_tasks
SET status = 'Pending', lease_expires_at = NULL, attempt_count = attempt_count - 1,
    updated_at = now()
WHERE id = %(id)s AND attempt_count = %(attempt)s AND status = 'InProgress'
"""

# A sharded task (no lease of its own) is waiting while one of its shards waits for a
# worker, and leased while one of its shards is under a live lease.
QUEUE_STATE: Final = """
SELECT
    count(*) FILTER (
        WHERE t.status = 'Pending' OR t.lease_expires_at < now() OR EXISTS (
            SELECT 1 FROM identity.access_fanout_shards AS s
            WHERE s.task_id = t.id AND s.status IN ('Pending', 'InProgress')
              AND (s.status = 'Pending' OR s.lease_expires_at < now()))
    ) AS backlog,
    count(*) FILTER (
        WHERE t.status = 'InProgress' AND (t.lease_expires_at >= now() OR EXISTS (
            SELECT 1 FROM identity.access_fanout_shards AS s
            WHERE s.task_id = t.id AND s.status = 'InProgress' AND s.lease_expires_at >= now()))
    ) AS leased,
    (SELECT count(*) FROM identity.access_fanout_tasks WHERE status = 'Failed') AS failed,
    extract(epoch FROM now() - min(t.created_at)) AS oldest_age_seconds
FROM identity.access_fanout_tasks AS t
WHERE t.status IN ('Pending', 'InProgress')
"""

TASKS_CHANNEL: Final = "identity_access_fanout_tasks"
NOTIFY_TASKS: Final = "SELECT pg_notify('identity_access_fanout_tasks', %(task_id)s::text)"
