-- The transactional outbox: how rows go in, and what `outbox status` reads.
-- {outbox}, {quarantine}, {discards}: the service's tables (identity_fanout.outbox.tables).

-- name: insert_outbox --
-- A writer's rows in one statement (one round trip per batch: the columns as arrays), with
-- ids in the order given. Each row's slot is its key's by {key_slot}, the one definition of
-- a key's lane (migration 0008), and the row's lane for good.
INSERT INTO {outbox} (topic, message_key, payload, headers, message_id, event_type, key_slot)
SELECT r.topic, r.message_key, r.payload, r.headers::jsonb, r.message_id, r.event_type,
       {key_slot}(r.message_key)
  FROM unnest(%(topics)s::text[], %(keys)s::text[], %(payloads)s::bytea[],
              %(headers)s::text[], %(message_ids)s::uuid[], %(event_types)s::text[])
       WITH ORDINALITY AS r (topic, message_key, payload, headers, message_id, event_type, n)
 ORDER BY r.n

-- name: status_by_topic --
SELECT topic, count(*) FROM {outbox} GROUP BY topic ORDER BY topic

-- name: status_head --
SELECT created_at, extract(epoch FROM clock_timestamp() - created_at)::float8
  FROM {outbox}
 ORDER BY id
 LIMIT 1

-- name: slot_backlog --
-- Rows waiting per slot and the age of each slot's oldest (s): a lane whose relay is stuck
-- shows as its own rows ageing while the others' move.
SELECT key_slot, count(*),
       extract(epoch FROM clock_timestamp() - min(created_at))::float8
  FROM {outbox}
 GROUP BY key_slot

-- name: depth --
-- How far the relays are behind, as the fan-out worker checks it before every batch: the id
-- span from the oldest unpublished row to the newest (an upper bound of the rows waiting:
-- rows the relays already published inside the span count too, so a slow lane holds the
-- fan-out back as a full outbox would), and the age of the oldest row. The head is found
-- once (the CTE, used twice, is computed once): finding it walks past the rows the relays
-- deleted and VACUUM has not removed yet, the costly part of a look that a throttled
-- worker repeats every 0.1 s; the newest is the last id handed out (the sequence: a tail of
-- deleted rows is never walked backward). The head's walk starts at the worker's floor
-- (`floor`, outbox.frontier): while a snapshot older than the deletes is held, a walk from the
-- first entry fetched every deleted row from the heap again.
WITH head AS (
    SELECT id, created_at FROM {outbox} WHERE id >= %(floor)s ORDER BY id LIMIT 1
)
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence({outbox_name}, 'id')::regclass)
                - (SELECT id FROM head) + 1, 0),
       coalesce(extract(epoch FROM clock_timestamp() - (SELECT created_at FROM head))::float8, 0)
