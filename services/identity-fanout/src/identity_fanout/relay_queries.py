"""SQL of the outbox relay, one named constant per query.

Every query runs on the relay's own autocommit connection, the one holding its lanes'
advisory locks, so each statement is its own short transaction and nothing holds row locks
between reads.
"""

from __future__ import annotations

from typing import Final

JOIN: Final = "SELECT pg_advisory_lock_shared(%(members)s, 0)"
"""Session-level and shared: every running relay instance holds it, so the holders counted
in `pg_locks` are the instances the lanes are shared among; it ends with the connection."""

TRY_LOCK_SLOTS: Final = """
SELECT s, pg_try_advisory_lock(%(class)s, s) FROM unnest(%(slots)s::int[]) AS s
"""
"""Session-level locks of a lane's slots: held until released or until the connection
ends (crash, network loss)."""

UNLOCK_SLOTS: Final = """
SELECT count(*) FILTER (WHERE pg_advisory_unlock(%(class)s, s)) FROM unnest(%(slots)s::int[]) AS s
"""

LANE_LOCKS: Final = """
SELECT l.classid::bigint, l.objid::bigint, l.pid, a.application_name, a.client_addr::text
  FROM pg_locks AS l
  LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'advisory'
   AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   -- A two-int4 key shows as classid = first key, objid = second key, objsubid = 2.
   AND l.objsubid = 2
   AND l.classid::bigint IN (%(class)s, %(members)s)
"""
"""Who is a relay instance (the shared member lock) and who holds which slot."""

READ_LANES: Final = """
SELECT id, topic, message_key, payload, headers, key_slot
  FROM (SELECT *, sum(octet_length(payload)) OVER (ORDER BY id) - octet_length(payload) AS before
          FROM (SELECT id, topic, message_key, payload, headers::text AS headers, key_slot
                  FROM identity.outbox
                 WHERE key_slot = ANY(%(slots)s::smallint[])
                   AND id > %(after)s
                 ORDER BY id
                 LIMIT %(limit)s) AS head) AS sized
 WHERE before < %(budget)s
 ORDER BY id
"""
"""The next rows of the held lanes after the last one in flight (`after` 0: from the head),
at most `limit` rows and as many as start within `budget` payload bytes (at least one row).
Only committed rows are visible (read committed, autocommit). A row committed late under a
lower id than the cursor is read once the window is empty again (the cursor then restarts
from the head)."""

SLOTS_OUTSIDE: Final = """
SELECT EXISTS (SELECT 1 FROM identity.outbox WHERE NOT key_slot = ANY(%(slots)s::smallint[]))
"""

DELETE_PUBLISHED: Final = "DELETE FROM identity.outbox WHERE id = ANY(%(ids)s::bigint[])"
"""Exactly the acknowledged ids, never a range: a writer that took a lower id may commit
after this round read higher ones, and `id <= last` would delete its unpublished row."""

BACKLOG: Final = """
WITH head AS (
    SELECT id, created_at FROM identity.outbox ORDER BY id LIMIT 1
)
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM identity.outbox ORDER BY id LIMIT %(exact_up_to)s) AS s),
       (SELECT max(id) FROM identity.outbox) - (SELECT id FROM head) + 1,
       (SELECT created_at FROM head),
       extract(epoch FROM clock_timestamp() - (SELECT created_at FROM head))::float8
"""
"""Cheap every round: an exact count up to a cap, the id span beyond it (an upper bound,
two primary-key lookups), and the age of the head row, the one the relay publishes next.

The count walks the primary key, not the heap: rows the relay deleted stay in the heap as
dead tuples until VACUUM, at its head, and a sequential count read through all of them at
every idle step (after each batch a writer commits) — 40-130 ms for 100,000 dead rows,
growing with the table; the index skips entries already found dead (~2 ms)."""

STATUS_BY_TOPIC: Final = """
SELECT topic, count(*) FROM identity.outbox GROUP BY topic ORDER BY topic
"""

STATUS_HEAD: Final = """
SELECT created_at, extract(epoch FROM clock_timestamp() - created_at)::float8
  FROM identity.outbox
 ORDER BY id
 LIMIT 1
"""

SLOT_BACKLOG: Final = """
SELECT key_slot, count(*) FROM identity.outbox GROUP BY key_slot
"""
