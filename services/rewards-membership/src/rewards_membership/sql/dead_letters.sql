-- rewards.dlq_replays: which DLQ records `dlq replay` republished, each at most once.

-- name: select_replays --
-- Which of a page of DLQ records were replayed already, and when.
SELECT r.dlq_partition, r.dlq_offset, r.replayed_at
FROM rewards.dlq_replays AS r
JOIN unnest(%(partitions)b::integer[], %(offsets)b::bigint[]) AS k (dlq_partition, dlq_offset)
  ON r.dlq_partition = k.dlq_partition AND r.dlq_offset = k.dlq_offset
WHERE r.dlq_topic = %(topic)s

-- name: insert_replays --
-- DLQ records whose republished copy the broker acknowledged.
INSERT INTO rewards.dlq_replays (dlq_topic, dlq_partition, dlq_offset, idempotency_key,
                                 target_topic, target_partition, target_offset, forced)
SELECT %(topic)s, p, o, k, t, tp, tof, %(forced)s
FROM unnest(%(partitions)b::integer[], %(offsets)b::bigint[], %(keys)b::text[],
            %(targets)b::text[], %(target_partitions)b::integer[],
            %(target_offsets)b::bigint[]) AS r (p, o, k, t, tp, tof)
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO NOTHING

-- rewards.dlq_resolutions: which DLQ records `dlq resolve` closed without a replay, and why.

-- name: select_resolutions --
-- Which of a page of DLQ records were resolved already, when and why.
SELECT r.dlq_partition, r.dlq_offset, r.resolved_at, r.reason
FROM rewards.dlq_resolutions AS r
JOIN unnest(%(partitions)b::integer[], %(offsets)b::bigint[]) AS k (dlq_partition, dlq_offset)
  ON r.dlq_partition = k.dlq_partition AND r.dlq_offset = k.dlq_offset
WHERE r.dlq_topic = %(topic)s

-- name: insert_resolutions --
-- The audit trail of a page of resolutions; a record resolved meanwhile keeps its first one.
INSERT INTO rewards.dlq_resolutions (dlq_topic, dlq_partition, dlq_offset, idempotency_key,
                                     reason)
SELECT %(topic)s, p, o, k, %(reason)s
FROM unnest(%(partitions)b::integer[], %(offsets)b::bigint[], %(keys)b::text[])
    AS r (p, o, k)
ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO NOTHING
RETURNING dlq_partition, dlq_offset
