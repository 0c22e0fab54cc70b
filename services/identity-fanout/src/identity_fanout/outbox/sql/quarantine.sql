-- The outbox quarantine: rows Kafka refused for good, kept whole with why.
-- {outbox}, {quarantine}, {discards}: the service's tables (identity_fanout.outbox.tables).

-- name: move --
-- Refused rows out of the outbox and into the quarantine, one statement (one transaction).
-- A row already gone from the outbox (deleted by hand meanwhile) is simply not moved.
WITH refused AS (
    SELECT *
      FROM unnest(%(ids)s::bigint[], %(codes)s::text[], %(reasons)s::text[], %(messages)s::text[])
           AS r (outbox_id, error_code, error_reason, error_message)
), moved AS (
    DELETE FROM {outbox} AS o
     USING refused AS r
     WHERE o.id = r.outbox_id
    RETURNING o.*, r.error_code, r.error_reason, r.error_message
)
INSERT INTO {quarantine} (
    outbox_id, topic, message_key, payload, headers, message_id, event_type, created_at,
    error_code, error_reason, error_message, attempts, first_failed_at, last_failed_at, key_slot
)
SELECT id, topic, message_key, payload, headers, message_id, event_type, created_at,
       error_code, error_reason, error_message,
       quarantine_attempts + 1,
       coalesce(first_failed_at, statement_timestamp()),
       statement_timestamp(),
       key_slot
  FROM moved
 ORDER BY id
RETURNING id AS quarantine_id, outbox_id, topic, message_key AS key, message_id, event_type,
          attempts, octet_length(payload) AS size

-- name: count_by_topic --
SELECT topic, count(*) FROM {quarantine} GROUP BY topic ORDER BY topic

-- name: select_quarantined --
-- A quarantined row as `outbox quarantine list/show` print it (the payload by size only);
-- {filter}: one of the fragments below.
SELECT id, outbox_id, topic, message_key AS key, message_id, event_type, created_at,
       error_code, error_reason, error_message, attempts, first_failed_at, last_failed_at,
       octet_length(payload) AS size, headers
  FROM {quarantine}
{filter}

-- name: oldest_first --
ORDER BY id LIMIT %(limit)s

-- name: by_id --
WHERE id = %(id)s

-- name: requeue --
-- Quarantined rows back to the tail of the outbox (new ids, in quarantine order, the same
-- key slot), keeping their attempt count and first failure so that a second refusal counts on.
WITH moved AS (
    DELETE FROM {quarantine}
     WHERE (%(all)s OR id = ANY(%(ids)s))
    RETURNING *
), requeued AS (
    INSERT INTO {outbox} (
        topic, message_key, payload, headers, message_id, event_type,
        quarantine_attempts, first_failed_at, key_slot
    )
    SELECT topic, message_key, payload, headers, message_id, event_type,
           attempts, first_failed_at, key_slot
      FROM moved
     ORDER BY id
    RETURNING id, message_id
)
SELECT m.id AS quarantine_id, r.id AS outbox_id, m.topic, m.message_key AS key, m.attempts
  FROM moved AS m
  JOIN requeued AS r ON r.message_id = m.message_id
 ORDER BY r.id

-- name: discard --
-- Quarantined rows an operator gave up on (the event will never be published; the runbook
-- says what to do for its key first), gone for good, each with its audit row written by the
-- same statement (who: the login and role of this session, the CLI's OS user and host; why:
-- the operator's reason); what they were, for the audit log line.
WITH gone AS (
    DELETE FROM {quarantine}
     WHERE (%(all)s OR id = ANY(%(ids)s))
    RETURNING *
), audited AS (
    INSERT INTO {discards} (
        quarantine_id, outbox_id, topic, message_key, message_id, event_type, error_code,
        error_reason, attempts, forced, reason, database_login, database_role, os_user, host
    )
    SELECT id, outbox_id, topic, message_key, message_id, event_type, error_code,
           error_reason, attempts, %(forced)s, %(reason)s, session_user, current_user,
           %(os_user)s, %(host)s
      FROM gone
     ORDER BY id
)
SELECT id AS quarantine_id, outbox_id, topic, message_key AS key, message_id, event_type,
       error_code, error_reason, attempts,
       session_user AS database_login, current_user AS database_role
  FROM gone
 ORDER BY id
