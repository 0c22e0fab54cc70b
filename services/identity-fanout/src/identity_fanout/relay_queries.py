"""SQL of the outbox relay, one named constant per query.

Every query runs on the relay's own autocommit connection, the one holding the advisory
lock, so each statement is its own short transaction and nothing holds row locks between
rounds.
"""

from __future__ import annotations

from typing import Final

TRY_LOCK: Final = "SELECT pg_try_advisory_lock(%(key)s)"
"""Session-level: held until released or until the connection ends (crash, network loss)."""

UNLOCK: Final = "SELECT pg_advisory_unlock(%(key)s)"

READ_BATCH: Final = """
SELECT id, topic, message_key, payload, headers
  FROM identity.outbox
 ORDER BY id
 LIMIT %(limit)s
"""
"""The head of the queue. Only committed rows are visible (read committed, autocommit)."""

DELETE_PUBLISHED: Final = "DELETE FROM identity.outbox WHERE id = ANY(%(ids)s)"
"""Exactly the acknowledged ids, never a range: a writer that took a lower id may commit
after this round read higher ones, and `id <= last` would delete its unpublished row."""

BACKLOG: Final = """
WITH head AS (
    SELECT id, created_at FROM identity.outbox ORDER BY id LIMIT 1
)
SELECT (SELECT count(*) FROM (SELECT 1 FROM identity.outbox LIMIT %(exact_up_to)s) AS s),
       (SELECT max(id) FROM identity.outbox) - (SELECT id FROM head) + 1,
       (SELECT created_at FROM head),
       extract(epoch FROM clock_timestamp() - (SELECT created_at FROM head))::float8
"""
"""Cheap every round: an exact count up to a cap, the id span beyond it (an upper bound,
two primary-key lookups), and the age of the head row, the one the relay publishes next."""

STATUS_BY_TOPIC: Final = """
SELECT topic, count(*) FROM identity.outbox GROUP BY topic ORDER BY topic
"""

STATUS_HEAD: Final = """
SELECT created_at, extract(epoch FROM clock_timestamp() - created_at)::float8
  FROM identity.outbox
 ORDER BY id
 LIMIT 1
"""

LOCK_HOLDER: Final = """
SELECT l.pid, a.application_name, a.client_addr::text, a.backend_start
  FROM pg_locks AS l
  LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'advisory'
   AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   -- A bigint key shows as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
   AND l.classid::bigint = %(high)s
   AND l.objid::bigint = %(low)s
   AND l.objsubid = 1
"""
