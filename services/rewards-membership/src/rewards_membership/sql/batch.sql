-- A batch applied by ONE statement: the inbox (spec step 1), the version guard and the
-- transitions (steps 3-4), the rows and the inbox marks written (steps 5-6), in one
-- transaction. The batch is ONE JSON document of BatchRecords (batch_sql.py) in consume
-- order; it decides exactly as the pure `rules/plan.plan_batch` (with `rules/guard.is_stale`
-- and `transition`) does, which stays the spec's executable definition:
-- tests/test_batch_sql_integration.py proves it on generated batches against PostgreSQL.

-- name: record_document --
-- The fragment `json_to_recordset` reads a batch document with: BatchRecord's fields, in
-- order, with their types (tests/test_sql_files.py checks the names against the type). A
-- dead letter has a key only (or nothing): it takes part in the inbox check alone.
key text, agent_user_id uuid, company_id uuid, status text, leave_reason text,
version bigint, joined_at timestamptz, left_at timestamptz, effective_at timestamptz

-- name: apply_batch --
-- Returns one row: one outcome letter per record in consume order (`a` membership-applied,
-- `s` skipped-stale-membership, `d` skipped-duplicate, `x` dead-lettered), the number of
-- existing rows the batch changes and the number the UPDATE changed.
--
-- Two instances racing: the rows are read without a lock (a row lock writes the tuple) in
-- the statement's snapshot, and the UPDATE is a compare-and-set on each row's `version`
-- (and its tuple, `ctid`): a row another writer changed after the snapshot is skipped
-- (PostgreSQL re-checks the condition on the newest row version), so fewer rows updated
-- than changed means the caller rolls back and decides the batch again on fresh rows. A
-- row or inbox key another instance inserted after the snapshot fails the INSERT (unique
-- violation), likewise.
--
-- One sort by (row, position) serves the guard's window, the row lookups (in key order)
-- and the rows' final state; `decided` holds every record once.
WITH decided AS (
    -- Every record with its outcome, and over its row's applied records (`row_all`): the
    -- last one's position (it carries the row's new membership), the first one's JoinedAt
    -- (FirstActivityAt ??= JoinedAt), the latest JoinedAt (Active) or LeftAt (Left), and
    -- how many applied (Version + 1 each). `transition` applied in turn comes down to that.
    SELECT o.*,
           max(o.position) FILTER (WHERE o.outcome = 'a') OVER row_all AS last_applied,
           max(o.first_joined_at) OVER row_all AS row_first_joined_at,
           max(CASE WHEN o.status = 'Active' THEN o.joined_at ELSE o.left_at END)
               FILTER (WHERE o.outcome = 'a') OVER row_all AS latest_activity,
           count(*) FILTER (WHERE o.outcome = 'a') OVER row_all AS changes
    FROM (
        -- The guard (`is_stale`): a row's watermark is its LastMembershipVersion, then the
        -- highest Version of the row's earlier records in this batch (`prior`; a stale one
        -- never raises it); a row absent so far takes any Version. A row's first applied
        -- record is the one no earlier record of the batch passed the row's watermark for.
        SELECT g.*, ap.agent_user_id IS NOT NULL AS found, ap.ctid AS read_ctid,
               ap.version AS read_version,
               ap.first_activity_at AS read_first_activity_at,
               ap.last_activity_at AS read_last_activity_at,
               CASE
                   WHEN g.duplicate THEN 'd'
                   WHEN g.agent_user_id IS NULL THEN 'x'
                   WHEN g.version > greatest(ap.last_membership_version, g.prior) IS NOT FALSE
                       THEN 'a'
                   ELSE 's'
               END AS outcome,
               CASE
                   WHEN NOT g.duplicate AND g.agent_user_id IS NOT NULL
                        AND g.version > greatest(ap.last_membership_version, g.prior)
                            IS NOT FALSE
                        AND coalesce(g.prior <= ap.last_membership_version, g.prior IS NULL)
                       THEN g.joined_at
               END AS first_joined_at
        FROM (
            SELECT b.*, max(b.version) FILTER (WHERE NOT b.duplicate) OVER earlier AS prior
            FROM (
                -- Spec step 1 first: a key already in the inbox (processed or
                -- dead-lettered), or met earlier in this batch, is a duplicate whatever
                -- the record holds. A dead letter (no agent) takes part in this alone.
                SELECT r.*,
                       r.key IS NOT NULL AND (r.repeated OR i.idempotency_key IS NOT NULL)
                           AS duplicate
                FROM (
                    SELECT r.ordinality AS position, r.key, r.agent_user_id, r.company_id,
                           r.status, r.leave_reason, r.version, r.joined_at, r.left_at,
                           r.effective_at,
                           row_number() OVER (PARTITION BY r.key ORDER BY r.ordinality) > 1
                               AS repeated
                    FROM ROWS FROM (json_to_recordset(%(records)s::json)
                                    AS ({record_document})) WITH ORDINALITY AS r
                ) AS r
                LEFT JOIN rewards.inbox AS i ON i.idempotency_key = r.key
            ) AS b
            WINDOW earlier AS (PARTITION BY b.agent_user_id, b.company_id ORDER BY b.position
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
        ) AS g
        LEFT JOIN rewards.agent_performance AS ap
          ON NOT g.duplicate AND ap.agent_user_id = g.agent_user_id
         AND ap.company_id = g.company_id
    ) AS o
    WINDOW row_all AS (PARTITION BY o.agent_user_id, o.company_id ORDER BY o.position
                       ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
final AS (
    -- Each changed row after the batch (its last applied record), under MembershipRow's
    -- field names: Active clears the leave's fields, Left sets them.
    SELECT d.agent_user_id, d.company_id,
           CASE WHEN d.status = 'Active' THEN 'Active' ELSE 'Left' END AS membership_status,
           CASE WHEN d.status = 'Active' THEN NULL ELSE d.leave_reason END AS leave_reason,
           CASE WHEN d.status = 'Active' THEN NULL ELSE d.left_at END AS left_at,
           CASE WHEN d.status = 'Active' THEN NULL ELSE d.effective_at END AS effective_at,
           coalesce(d.read_first_activity_at, d.row_first_joined_at) AS first_activity_at,
           greatest(d.read_last_activity_at, d.latest_activity) AS last_activity_at,
           d.version AS last_membership_version,
           coalesce(d.read_version, 0) + d.changes AS version,
           d.found, d.read_ctid, d.read_version
    FROM decided AS d
    WHERE d.position = d.last_applied
),
updated AS (
    -- Membership columns only (the assignments: MembershipRow's fields but its key); the
    -- earned metrics are not named here on purpose. Compare-and-set: the tuple read, at
    -- the version read.
    UPDATE rewards.agent_performance AS ap
    SET {assignments}, updated_at = now()
    FROM final AS f
    WHERE f.found AND ap.ctid = f.read_ctid AND ap.version = f.read_version
      AND ap.agent_user_id = f.agent_user_id AND ap.company_id = f.company_id
    RETURNING 1
),
inserted AS (
    -- Lazily created rows; earned metrics take their zero defaults. No ON CONFLICT.
    INSERT INTO rewards.agent_performance ({columns})
    SELECT {columns} FROM final WHERE NOT found
),
marked AS (
    -- The inbox marks of the applied and stale records (duplicates add none; dead
    -- letters are marked once their DLQ copy is acknowledged). No ON CONFLICT.
    INSERT INTO rewards.inbox (idempotency_key, outcome)
    SELECT key, CASE outcome WHEN 'a' THEN 'membership-applied'
                             ELSE 'skipped-stale-membership' END
    FROM decided
    WHERE outcome IN ('a', 's')
)
SELECT (SELECT string_agg(outcome, '' ORDER BY position) FROM decided) AS outcomes,
       (SELECT count(*) FROM final WHERE found) AS changed,
       (SELECT count(*) FROM updated) AS updated
