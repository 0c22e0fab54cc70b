-- LISTEN/NOTIFY: how a writer wakes a waiting worker or relay at once, on commit.

-- name: listen --
-- {channel}: the channel name as an identifier (pin_runtime.postgres.listen).
LISTEN {channel}

-- name: notify --
-- In the writer's transaction: delivered on commit, dropped on rollback.
SELECT pg_notify(%(channel)s, %(payload)s)
