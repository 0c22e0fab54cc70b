-- rewards.agent_performance as the consumer sees it: the membership columns of a row
-- (MembershipRow), never the earned metrics. A batch is one statement per step whatever
-- its size; rows travel as ONE JSON document each way.

-- name: row_document --
-- The fragment `json_to_recordset` reads a row document with: MembershipRow's fields, in
-- order, with their types (tests/test_sql_files.py checks the names against the row type).
agent_user_id uuid, company_id uuid, membership_status text, leave_reason text,
left_at timestamptz, effective_at timestamptz, first_activity_at timestamptz,
last_activity_at timestamptz, last_membership_version bigint, version bigint

-- name: read_rows --
-- The existing rows of the batch's (agent, agency) pairs, as one JSON array. Not locked:
-- locking a row writes it, which cost about what the update does; `update_rows` instead
-- applies only to a row whose version is still the one read here.
WITH current AS (
    SELECT {columns}
    FROM rewards.agent_performance AS ap
    JOIN (SELECT (k->>0)::uuid AS agent_user_id, (k->>1)::uuid AS company_id
          FROM json_array_elements(%(keys)s::json) AS k) AS k
      ON ap.agent_user_id = k.agent_user_id AND ap.company_id = k.company_id
)
SELECT coalesce(json_agg(current), '[]')::text FROM current

-- name: update_rows --
-- Membership columns only (`{assignments}`: MembershipRow's fields but its key, each from
-- the row document); earned metrics are not named here on purpose. Compare-and-set: each
-- row document travels with the version its row had when read (`read_versions`, in the
-- same order), and a row updates only if it still has it. Fewer rows updated than sent
-- means another writer changed one since the read: the caller rolls the batch back and
-- decides it again on fresh rows, so the guard always ran against the row it replaces.
UPDATE rewards.agent_performance AS ap
SET {assignments}, updated_at = now()
FROM ROWS FROM (unnest(%(read_versions)s::bigint[]),
                json_to_recordset(%(rows)s::json) AS ({row_document})) AS u (read_version)
WHERE ap.agent_user_id = u.agent_user_id AND ap.company_id = u.company_id
  AND ap.version = u.read_version

-- name: insert_rows --
-- Lazily created rows; earned metrics take their zero defaults. No ON CONFLICT: a row
-- another instance created meanwhile fails the batch, which is re-decided.
INSERT INTO rewards.agent_performance ({columns})
SELECT * FROM json_to_recordset(%(rows)s::json) AS r ({row_document})

-- name: probe --
-- The recovery probe after an outage: does the database answer again?
SELECT 1
