-- rewards.agent_performance as the consumer sees it: the membership columns of a row
-- (MembershipRow), never the earned metrics. A batch is one statement per step whatever
-- its size; rows travel as ONE JSON document each way.

-- name: row_document --
-- The fragment `json_to_recordset` reads a row document with: MembershipRow's fields, in
-- order, with their types (tests/test_sql_files.py checks the names against the row type).
agent_user_id uuid, company_id uuid, membership_status text, leave_reason text,
left_at timestamptz, effective_at timestamptz, first_activity_at timestamptz,
last_activity_at timestamptz, last_membership_version bigint, version bigint

-- name: lock_rows --
-- The existing rows of the batch's (agent, agency) pairs, locked for the batch, returned as
-- one JSON array. Ordered by key so two instances locking overlapping sets never deadlock.
WITH locked AS (
    SELECT {columns}
    FROM rewards.agent_performance AS ap
    JOIN (SELECT (k->>0)::uuid AS agent_user_id, (k->>1)::uuid AS company_id
          FROM json_array_elements(%(keys)s::json) AS k) AS k
      ON ap.agent_user_id = k.agent_user_id AND ap.company_id = k.company_id
    ORDER BY ap.agent_user_id, ap.company_id
    FOR UPDATE OF ap
)
SELECT coalesce(json_agg(locked), '[]')::text FROM locked

-- name: update_rows --
-- Membership columns only (`{assignments}`: MembershipRow's fields but its key, each from
-- the row document); earned metrics are not named here on purpose. The version
-- condition repeats the guard in SQL: the rows are locked, so it always holds.
UPDATE rewards.agent_performance AS ap
SET {assignments}, updated_at = now()
FROM json_to_recordset(%(rows)s::json) AS u ({row_document})
WHERE ap.agent_user_id = u.agent_user_id AND ap.company_id = u.company_id
  AND ap.last_membership_version < u.last_membership_version

-- name: insert_rows --
-- Lazily created rows; earned metrics take their zero defaults. No ON CONFLICT: a row
-- another instance created meanwhile fails the batch, which is re-decided.
INSERT INTO rewards.agent_performance ({columns})
SELECT * FROM json_to_recordset(%(rows)s::json) AS r ({row_document})

-- name: probe --
-- The recovery probe after an outage: does the database answer again?
SELECT 1
