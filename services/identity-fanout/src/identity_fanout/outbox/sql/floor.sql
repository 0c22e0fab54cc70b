-- The outbox floor (identity_fanout.outbox.floor): the lowest id that may still hold a row.
-- {outbox}: the outbox table, {outbox_name}: its qualified name (for its identity sequence).

-- name: floor --
-- One step of the floor, three parts in one statement:
-- 1. `upto` (a candidate checked by an earlier statement, or NULL): every row with an id up
--    to it is committed or never will be, so the floor rises to the first row still there,
--    or past `upto`. This statement's snapshot was taken after that check saw the writers
--    gone, so their rows are visible to it. The walk from the old floor passes only the
--    rows deleted since, once.
-- 2. `since` (the pending candidate's time, or NULL): whether every transaction that may
--    have taken an id before it has ended. Blocking: a session of this database in a
--    transaction begun at or before `since` that is running a statement or holds a
--    transaction id (a COPY takes its ids before it writes), a session this login may not
--    see (NULL state: no pg_read_all_stats), and any prepared transaction. A session idle
--    in a transaction without an id (a reader holding a snapshot) never inserts a row:
--    it does not block, and that is the case that matters (its snapshot keeps the deleted
--    rows' index entries alive).
-- 3. the next candidate: the last id handed out, then the time, in that order (the CTE is
--    read before the clock): an id up to it was taken by a transaction begun before.
WITH last AS MATERIALIZED (
    SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence({outbox_name}, 'id')::regclass),
                    0) AS id
)
SELECT CASE WHEN %(upto)s::bigint IS NULL THEN %(floor)s::bigint
            ELSE coalesce((SELECT id FROM {outbox}
                            WHERE id >= %(floor)s::bigint AND id <= %(upto)s::bigint
                            ORDER BY id LIMIT 1),
                          %(upto)s::bigint + 1)
        END,
       %(since)s::timestamptz IS NOT NULL
       AND NOT EXISTS (
           SELECT 1 FROM pg_stat_activity AS a
            WHERE a.datname = current_database()
              AND a.pid <> pg_backend_pid()
              AND a.backend_type = 'client backend'
              AND (a.state IS NULL
                   OR (a.xact_start <= %(since)s::timestamptz
                       AND (a.backend_xid IS NOT NULL
                            OR a.state NOT IN ('idle in transaction',
                                               'idle in transaction (aborted)')))))
       AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE database = current_database()),
       last.id,
       clock_timestamp()
  FROM last
