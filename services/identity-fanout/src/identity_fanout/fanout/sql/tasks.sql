-- The queue of fan-out tasks as the worker's gauges and the runbook commands see it.

-- name: queue_state --
-- A sharded task is waiting while one of its shards waits for a worker, and leased while one
-- of its shards is under a live lease. oldest_waiting_seconds: how long the task no worker
-- serves has waited: a whole task since it became claimable (enqueued or handed back, or its
-- lease ran out), a sharded task none of whose shards is leased since the last time a worker
-- took or finished one; a task being walked, or whose other shards are, is not waiting.
SELECT
    count(*) FILTER (
        WHERE t.status = 'Pending' OR t.lease_expires_at < now() OR EXISTS (
            SELECT 1 FROM identity.access_fanout_shards AS s
            WHERE s.task_id = t.id AND s.status IN ('Pending', 'InProgress')
              AND (s.status = 'Pending' OR s.lease_expires_at < now()))
    ) AS backlog,
    -- A sharded task's own lease is a roll-up of its shards' (it can outlive the shards a
    -- stopping worker handed back): its shards' leases alone say whether it is walked.
    count(*) FILTER (
        WHERE t.status = 'InProgress' AND (
            (t.shard_count = 0 AND t.lease_expires_at >= now()) OR EXISTS (
            SELECT 1 FROM identity.access_fanout_shards AS s
            WHERE s.task_id = t.id AND s.status = 'InProgress' AND s.lease_expires_at >= now()))
    ) AS leased,
    (SELECT count(*) FROM identity.access_fanout_tasks WHERE status = 'Failed') AS failed,
    extract(epoch FROM now() - min(t.created_at)) AS oldest_age_seconds,
    coalesce(extract(epoch FROM now() - min(
        CASE
            WHEN t.shard_count = 0 AND t.status = 'Pending' THEN t.updated_at
            WHEN t.shard_count = 0 AND t.lease_expires_at < now() THEN t.lease_expires_at
            WHEN t.shard_count > 0 AND NOT EXISTS (
                SELECT 1 FROM identity.access_fanout_shards AS s
                WHERE s.task_id = t.id AND s.status = 'InProgress'
                  AND s.lease_expires_at >= now())
            THEN (
                -- No shard's lease is live here: a lease left is one that ran out.
                SELECT greatest(t.created_at, max(greatest(
                    s.started_at, s.completed_at, s.lease_expires_at)))
                FROM identity.access_fanout_shards AS s
                WHERE s.task_id = t.id
                HAVING bool_or(s.status IN ('Pending', 'InProgress')))
        END)), 0) AS oldest_waiting_seconds
FROM identity.access_fanout_tasks AS t
WHERE t.status IN ('Pending', 'InProgress')

-- name: enqueue_task --
INSERT INTO identity.access_fanout_tasks (id, role_id, company_id, role_version, reason, status)
VALUES (%(task_id)s, %(role_id)s, %(company_id)s, %(version)s, %(reason)s, %(status)s)

-- name: select_tasks --
-- Tasks ({columns}: identity_fanout.fanout.queue.FanOutTask) with their role's code (the
-- runbook's listings name the role) {filter}: one of the fragments below.
SELECT {columns} FROM (
    SELECT t.*, r.code AS role_code
    FROM identity.access_fanout_tasks AS t
    JOIN identity.role_definitions AS r ON r.id = t.role_id
) AS tasks {filter}

-- name: newest_first --
-- `tasks list`: either filter may be null (then it is no filter).
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(role_id)s::uuid IS NULL OR role_id = %(role_id)s)
ORDER BY created_at DESC, id LIMIT %(limit)s

-- name: unfinished_of_role --
-- `roles show`: the role's work still to do (Failed: waiting for a replay), oldest first.
WHERE role_id = %(role_id)s AND status IN ('Pending', 'InProgress', 'Failed')
ORDER BY created_at, id

-- name: by_id --
WHERE id = %(id)s

-- name: task_counts --
-- `identity-fanout status`: each unfinished task counted once. Being walked while a unit
-- of it is under a live lease: the task itself when walked as one unit, else one of its
-- shards (a sharded task's own lease is only a roll-up of its shards' and can outlive the
-- shards a stopping worker handed back); waiting otherwise. shards_waiting: the tasks being
-- walked that also have shards no worker serves (more workers would take them).
SELECT
    count(*) FILTER (WHERE NOT walked) AS waiting,
    count(*) FILTER (WHERE walked) AS being_walked,
    count(*) FILTER (WHERE walked AND shards_waiting) AS walked_with_shards_waiting,
    extract(epoch FROM now() - min(created_at))::float8 AS oldest_age_seconds
FROM (
    SELECT t.created_at,
        CASE WHEN t.shard_count = 0
            THEN t.status = 'InProgress' AND t.lease_expires_at >= now()
            ELSE EXISTS (
                SELECT 1 FROM identity.access_fanout_shards AS s
                WHERE s.task_id = t.id AND s.status = 'InProgress'
                  AND s.lease_expires_at >= now())
        END AS walked,
        t.shard_count > 0 AND EXISTS (
            SELECT 1 FROM identity.access_fanout_shards AS s
            WHERE s.task_id = t.id AND (s.status = 'Pending'
                OR (s.status = 'InProgress' AND s.lease_expires_at < now()))) AS shards_waiting
    FROM identity.access_fanout_tasks AS t
    WHERE t.status IN ('Pending', 'InProgress')
) AS unfinished

-- name: replay_task --
-- The replay of a poisoned task, after its cause is fixed: Status -> Pending,
-- AttemptCount = 0. The snapshot semantics make a repeat safe. The Cursor is kept: users
-- before it already received this RoleVersion's events. A sharded task returns to
-- InProgress instead, the state whose shards are claimable (Pending would let the task
-- claim take it as one unit); its shards are replayed first (shards.sql replay_shards).
UPDATE identity.access_fanout_tasks
SET status = CASE WHEN shard_count = 0 THEN 'Pending' ELSE 'InProgress' END,
    attempt_count = 0, lease_expires_at = NULL, completed_at = NULL, updated_at = now()
WHERE id = %(id)s AND status = 'Failed'

-- name: supersede_shards --
-- A permission change of a role supersedes the remaining work of the role's older tasks
-- (their remaining users get the newer snapshot): first their shards, in the order workers
-- lock them (shard, then task; no deadlock with a shard batch rolling up). A shard batch in
-- flight finishes first (its row is locked); its next batch finds the shard finished and
-- stops. Failed shards and tasks are covered too: the newer version replaces their replay.
UPDATE identity.access_fanout_shards
SET status = 'Completed', lease_expires_at = NULL, completed_at = now(), updated_at = now()
WHERE task_id IN (
    SELECT id FROM identity.access_fanout_tasks
    WHERE role_id = %(role_id)s AND role_version < %(version)s
      AND status IN ('Pending', 'InProgress', 'Failed'))
  AND status IN ('Pending', 'InProgress', 'Failed')

-- name: supersede_tasks --
-- Then the tasks. A split committing meanwhile may leave Pending shards behind: they are
-- never claimed, since a shard is claimed only while its task is InProgress.
UPDATE identity.access_fanout_tasks
SET status = 'Completed', superseded_by_version = %(version)s, lease_expires_at = NULL,
    completed_at = now(), updated_at = now()
WHERE role_id = %(role_id)s AND role_version < %(version)s
  AND status IN ('Pending', 'InProgress', 'Failed')
RETURNING id

-- name: superseded_by --
-- The version that superseded a task, if one did: why a worker's fence failed.
SELECT superseded_by_version FROM identity.access_fanout_tasks WHERE id = %(id)s
