-- The outbox relay's reads and deletes. Every statement runs on an autocommit connection,
-- so each is its own short transaction and nothing holds row locks between reads.
-- {outbox}, {quarantine}, {discards}: the service's tables (identity_fanout.outbox.tables).

-- name: read_lanes --
-- The next rows of the held slots, each slot's after its cursor (the last id read in it;
-- without one, the outbox floor, outbox.frontier, never the first index entry) and up to
-- its frontier (every row up to it is committed or never will be: nothing commits behind a
-- cursor), at most limit rows in id order and as many as start within budget payload bytes
-- (at least one row). `afters` and `uptos` are indexed by slot + 1; `after` and `upto`
-- bound the walk of the primary key. The per-slot bounds are one expression in `coalesce`:
-- the planner takes half the rows through it (two comparisons with unknown bounds it would
-- take as a ninth, and a burst would be read by a bitmap scan and a sort of all of it).
SELECT id, topic, message_key, payload, headers, key_slot
  FROM (SELECT *, sum(octet_length(payload)) OVER (ORDER BY id) - octet_length(payload) AS before
          FROM (SELECT id, topic, message_key, payload, headers::text AS headers, key_slot
                  FROM {outbox}
                 WHERE key_slot = ANY(%(slots)s::smallint[])
                   AND id > %(after)s AND id <= %(upto)s
                   AND coalesce(id > (%(afters)s::bigint[])[key_slot + 1]
                                AND id <= (%(uptos)s::bigint[])[key_slot + 1], false)
                 ORDER BY id
                 LIMIT %(limit)s) AS head) AS sized
 WHERE before < %(budget)s
 ORDER BY id

-- name: read_slot_heads --
-- The same rows as `read_lanes`, for a relay holding few slots: each slot's head along the
-- (key_slot, id) index, merged in id order ({heads}: one `slot_head` per slot, UNION ALL),
-- so a read touches only the relay's own rows instead of walking the primary key past the
-- other relays' rows and the dead ones at the head (identity_fanout.outbox.store.OutboxStore.read_statement).
SELECT id, topic, message_key, payload, headers, key_slot
  FROM (SELECT *, sum(octet_length(payload)) OVER (ORDER BY id) - octet_length(payload) AS before
          FROM (SELECT * FROM ({heads}) AS heads
                 ORDER BY id
                 LIMIT %(limit)s) AS head) AS sized
 WHERE before < %(budget)s
 ORDER BY id

-- name: slot_head --
-- One slot's next rows, for `read_slot_heads` ({slot}: the slot, {index}: slot + 1, as
-- literals, so that each branch is planned on its own range of the index).
(SELECT id, topic, message_key, payload, headers::text AS headers, key_slot
   FROM {outbox}
  WHERE key_slot = {slot}
    AND id > (%(afters)s::bigint[])[{index}]
    AND id <= (%(uptos)s::bigint[])[{index}]
  ORDER BY id
  LIMIT %(limit)s)

-- name: delete_published --
-- Exactly the acknowledged ids, never a range: a writer that took a lower id may commit
-- after this round read higher ones, and id <= last would delete its unpublished row.
DELETE FROM {outbox} WHERE id = ANY(%(ids)s::bigint[])

-- name: backlog --
-- Cheap every round: an exact count up to a cap, the id span beyond it (an upper bound:
-- the head to the last id handed out, so that a tail of deleted rows is never walked
-- backward), and the age of the head row, the one the relay publishes next.
-- The count walks the primary key, not the heap: rows the relay deleted stay in the heap as
-- dead tuples until VACUUM, at its head, and a sequential count read through all of them at
-- every idle step, growing with the table; the index skips entries already found dead.
-- Each walk starts at the floor (`floor`, outbox.frontier): while a snapshot older than the
-- deletes is held no entry can be found dead, and the walk from the first entry fetched
-- every deleted row from the heap again (docs/design/identity-fanout.md "The outbox frontier").
WITH head AS (
    SELECT id, created_at FROM {outbox} WHERE id >= %(floor)s ORDER BY id LIMIT 1
)
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM {outbox} WHERE id >= %(floor)s ORDER BY id
             LIMIT %(exact_up_to)s) AS s),
       pg_sequence_last_value(pg_get_serial_sequence({outbox_name}, 'id')::regclass)
           - (SELECT id FROM head) + 1,
       (SELECT created_at FROM head),
       extract(epoch FROM clock_timestamp() - (SELECT created_at FROM head))::float8
