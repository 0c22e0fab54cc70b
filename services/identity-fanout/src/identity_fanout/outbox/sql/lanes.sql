-- The advisory locks of the outbox lanes (identity_fanout.outbox.rules): which relay instance
-- publishes which slots. Session-level locks on the relay's own connection: they end with it.
-- {outbox_name}: the outbox table's qualified name (identity_fanout.outbox.tables).

-- name: join_members --
-- Session-level and shared: every running relay instance holds it, so the holders counted
-- in pg_locks are the instances the lanes are shared among; it ends with the connection.
SELECT pg_advisory_lock_shared(%(members)s, 0)

-- name: plan_in_id_order --
-- The lanes' session never sorts: everything it reads (a lane's rows, the backlog, the
-- floor's walk) comes along an index in id order, however few rows the statistics of an
-- outbox analyzed while empty promise. A read's per-slot bounds (cursor, frontier) are
-- taken by the planner as a fraction of the rows, and with statistics of an empty outbox a
-- burst of 30,000 was read by a bitmap scan and a sort of all of it instead of 5,000 rows
-- along the primary key (`tests/test_relay_plans_integration.py`).
SET enable_sort = off

-- name: try_lock_slots --
-- Session-level locks of a lane's slots: held until released or until the connection
-- ends (crash, network loss).
SELECT s, pg_try_advisory_lock(%(class)s, s) FROM unnest(%(slots)s::int[]) AS s

-- name: unlock_slots --
SELECT count(*) FILTER (WHERE pg_advisory_unlock(%(class)s, s)) FROM unnest(%(slots)s::int[]) AS s

-- name: lane_locks --
-- Who is a relay instance (the shared member lock) and who holds which slot, and whether
-- the holder's login may be a relay at all (it may delete published rows): any other
-- session holding these locks is foreign, counted as no instance and reported. Read as
-- identity_fanout.outbox.rules.LaneLock.
SELECT l.classid::bigint = %(members)s AS member, l.objid::bigint AS key, l.pid,
       a.application_name, a.client_addr::text AS client_addr, a.usename::text AS user_name,
       coalesce(has_table_privilege(a.usesysid, {outbox_name}, 'DELETE'), false)
           AS relay_login
  FROM pg_locks AS l
  LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'advisory'
   AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   -- A two-int4 key shows as classid = first key, objid = second key, objsubid = 2.
   AND l.objsubid = 2
   AND l.classid::bigint IN (%(class)s, %(members)s)

-- name: set_name --
-- The session's application_name, changed with the relay's pause (outbox.pause_mark):
-- pg_stat_activity shows it to `outbox status` beside the session's lane locks.
SELECT set_config('application_name', %(name)s, false)
