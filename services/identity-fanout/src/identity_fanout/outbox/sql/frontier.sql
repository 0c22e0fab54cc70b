-- The outbox frontier (identity_fanout.outbox.frontier): per slot, the id up to which every
-- row is committed or never will be; and the floor, the lowest id that may hold a row.
-- {outbox}: the outbox table, {outbox_name}: its qualified name (for its id sequence).

-- name: step --
-- One step, three parts in one statement:
-- 1. the last id handed out (the CTE, read first);
-- 2. then the writers still open, from pg_locks: each transaction that may write a row of a
--    slot holds the shared lock (writer class, slot) from before its first id there until it
--    ends (migration 0012's trigger), so a transaction that took an id up to `last` shows
--    here unless it has ended. pg_locks needs no grant and lists prepared transactions too;
--    a transaction that writes no outbox row (a reader's snapshot, another table's long
--    transaction) holds no such lock and never holds a slot back. With each holder, the
--    first id it took, if it shows it yet (migration 0013: the lock (first-id class + the
--    id's high 32 bits, its low 32 bits), taken right after that id): none of its rows is
--    below it. The LATERAL reference to `last` makes the lock table be read after the
--    sequence;
-- 3. the floor: `upto` (every slot's frontier as the previous step confirmed it, or NULL)
--    lets it rise to the first row still there at or below it, or past it. This statement's
--    snapshot was taken after that step saw the writers gone, so their rows are visible to
--    it. The walk from the old floor passes only the rows deleted since, once.
WITH last AS MATERIALIZED (
    SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence({outbox_name}, 'id')::regclass),
                    0) AS id
)
SELECT last.id,
       held.slots,
       held.writers,
       held.firsts,
       CASE WHEN %(upto)s::bigint IS NULL THEN %(floor)s::bigint
            ELSE coalesce((SELECT id FROM {outbox}
                            WHERE id >= %(floor)s::bigint AND id <= %(upto)s::bigint
                            ORDER BY id LIMIT 1),
                          greatest(%(floor)s::bigint, %(upto)s::bigint + 1))
        END
  FROM last
 CROSS JOIN LATERAL (
    WITH locks AS MATERIALIZED (
        SELECT l.classid::bigint AS key1, l.objid::bigint AS key2, l.virtualtransaction
          FROM pg_locks AS l
         WHERE last.id IS NOT NULL
           AND l.locktype = 'advisory'
           AND l.granted
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           -- A two-int4 key shows as classid = first key, objid = second key (both
           -- unsigned), objsubid = 2.
           AND l.objsubid = 2
           AND (l.classid::bigint = %(class)s
                OR l.classid::bigint BETWEEN %(first_class)s AND %(first_class)s + 65535)
    ), firsts AS (
        SELECT virtualtransaction, min(((key1 - %(first_class)s) << 32) + key2) AS id
          FROM locks
         WHERE key1 BETWEEN %(first_class)s AND %(first_class)s + 65535
         GROUP BY virtualtransaction
    )
    SELECT coalesce(array_agg(s.key2::int), '{{}}') AS slots,
           coalesce(array_agg(s.virtualtransaction), '{{}}') AS writers,
           coalesce(array_agg(f.id), '{{}}') AS firsts
      FROM locks AS s
      LEFT JOIN firsts AS f USING (virtualtransaction)
     WHERE s.key1 = %(class)s
 ) AS held

-- name: open_writers --
-- Who holds the slots back (`outbox status`): each transaction holding writer locks, with
-- its slots and its session (pid, login, application, state, xact_start from
-- pg_stat_activity) or, for a prepared transaction (no pid), its gid, owner and prepare
-- time from pg_prepared_xacts. A prepared transaction's virtualtransaction is not always
-- `-1/<xid>` (PostgreSQL 15.18 keeps the one of the session that prepared it): it is
-- found through the lock on its transaction id, held under the same virtualtransaction as
-- its advisory locks; pg_locks is read once, so both come from one look.
-- Nothing needs a grant: another login's state and xact_start are NULL without
-- pg_read_all_stats (the caller says unknown); a prepared transaction's time shows to all.
WITH locks AS MATERIALIZED (
    SELECT l.locktype, l.virtualtransaction, l.pid, l.objid, l.transactionid
      FROM pg_locks AS l
     WHERE l.granted
       AND ((l.locktype = 'advisory'
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             -- A two-int4 key shows as classid = first key, objid = second key, objsubid = 2.
             AND l.objsubid = 2
             AND l.classid::bigint = %(class)s)
            OR (l.locktype = 'transactionid' AND l.pid IS NULL))
), writers AS (
    SELECT virtualtransaction, pid, array_agg(objid::int ORDER BY objid) AS slots
      FROM locks
     WHERE locktype = 'advisory'
     GROUP BY virtualtransaction, pid
)
SELECT w.slots, w.pid, p.gid, a.application_name,
       coalesce(a.usename, p.owner)::text AS user_name,
       CASE WHEN p.gid IS NOT NULL THEN 'prepared' ELSE a.state END AS state,
       coalesce(a.xact_start, p.prepared) AS since,
       extract(epoch FROM clock_timestamp() - coalesce(a.xact_start, p.prepared))::float8
           AS open_seconds
  FROM writers AS w
  LEFT JOIN pg_stat_activity AS a ON a.pid = w.pid
  LEFT JOIN LATERAL (
    SELECT x.gid, x.owner, x.prepared
      FROM locks AS t
      JOIN pg_prepared_xacts AS x ON x.transaction = t.transactionid
     WHERE w.pid IS NULL
       AND t.locktype = 'transactionid'
       AND t.virtualtransaction = w.virtualtransaction
     LIMIT 1
  ) AS p ON true
 ORDER BY since NULLS LAST, w.pid, p.gid
