-- LISTEN/NOTIFY: how a writer wakes the worker (tasks) or the relay (outbox) at once.

-- name: listen --
-- {channel}: the channel name as an identifier (identity_fanout.channels).
LISTEN {channel}

-- name: notify --
-- In the writer's transaction: delivered on commit, dropped on rollback.
SELECT pg_notify(%(channel)s, %(payload)s)
