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
--    transaction) holds no such lock and never holds a slot back. The LATERAL reference to
--    `last` makes the lock table be read after the sequence;
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
       CASE WHEN %(upto)s::bigint IS NULL THEN %(floor)s::bigint
            ELSE coalesce((SELECT id FROM {outbox}
                            WHERE id >= %(floor)s::bigint AND id <= %(upto)s::bigint
                            ORDER BY id LIMIT 1),
                          greatest(%(floor)s::bigint, %(upto)s::bigint + 1))
        END
  FROM last
 CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(l.objid::int), '{{}}') AS slots,
           coalesce(array_agg(l.virtualtransaction), '{{}}') AS writers
      FROM pg_locks AS l
     WHERE last.id IS NOT NULL
       AND l.locktype = 'advisory'
       AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       -- A two-int4 key shows as classid = first key, objid = second key, objsubid = 2.
       AND l.objsubid = 2
       AND l.classid::bigint = %(class)s
 ) AS held
