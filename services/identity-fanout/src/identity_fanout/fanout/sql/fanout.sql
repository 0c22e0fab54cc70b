-- What the fan-out reads of the role model (identity_fanout.fanout.assignments): counts and
-- the shard bounds; and the page statement both fan-out paths write their events with
-- (identity_fanout.fanout.page), with the page of a role's users it composes in.

-- name: page_users --
-- One page of the role's users: distinct UserIds of Active assignments after the cursor, up
-- to the unit's upper bound (a task as one unit passes the largest UUID). Served by
-- ix_role_assignments_role_active_user as an index-only scan.
SELECT DISTINCT user_id
FROM identity.role_assignments
WHERE role_id = %(role_id)s AND status = 'Active'
  AND user_id > %(after)s AND user_id <= %(upper)s
ORDER BY user_id
LIMIT %(limit)s

-- name: count_users_up_to --
-- Whether a role has more than limit - 1 users (inline fan-out, the shard split gate): only
-- "more or not" matters, so the count stops there; a small role costs one short scan.
SELECT count(*) FROM (
    SELECT DISTINCT user_id FROM identity.role_assignments
    WHERE role_id = %(role_id)s AND status = 'Active'
    LIMIT %(limit)s
) AS users

-- name: count_users --
SELECT count(DISTINCT user_id) FROM identity.role_assignments
WHERE role_id = %(role_id)s AND status = 'Active'

-- name: split_bounds --
-- The inner shard bounds: every step-th of the role's distinct users in UserId order, so
-- the shards hold about equal numbers of users. The index-only scan already yields them in
-- order: numbering them costs no sort (percentile_disc would sort them all).
SELECT user_id FROM (
    SELECT user_id, row_number() OVER (ORDER BY user_id) AS rn
    FROM (
        SELECT DISTINCT user_id FROM identity.role_assignments
        WHERE role_id = %(role_id)s AND status = 'Active'
    ) AS users
) AS numbered
WHERE rn %% %(step)s = 0
ORDER BY rn
LIMIT %(bounds)s

-- name: write_page --
-- A page of a role change's events, the one builder of the UserAccessChanged record: the
-- worker's batch (the next page of its unit) and set-role-permissions' inline fan-out (the
-- whole small role as one page) both run it (fanout/page.py). The page of the role's users
-- ({page}: page_users, composed in by page.py); each user's snapshot, read within the
-- statement (no round trip per user); each user's envelope, its headers, MessageId, key and lane slot
-- ({key_slot}), INSERTed into the outbox ({outbox}: composed by the outbox's store).
-- Returns the page's size and its last user (a unit's checkpoint cursor).
-- The snapshot: every Active assignment of the user whose ExpiresAt is unset or in the
-- future, by assignment id, with its role's code. One whose ExpiresAt has passed is left
-- out even before the expiry job marks it Expired: a snapshot never extends access. A page
-- user left with none still gets an event, with an empty snapshot (the LEFT JOIN).
-- The JSON is written compact, in pin_contracts' field order, with explicit nulls: the
-- bytes pin_contracts.encode writes for the same envelope
-- (tests/test_page_writer_integration.py holds it against envelopes built from
-- pin_contracts structs). Per-page constants come as parameters, already JSON-encoded by
-- msgspec (page.py): the event type, contract version, aggregate type, change reason,
-- OccurredAt, CorrelationId, the header names and the page's trace-context headers.
-- Timestamps are formatted in UTC whatever the session's TimeZone ("Z", microseconds only
-- when not zero, as msgspec writes them; pin_contracts README "Timestamps"). An ExpiresAt
-- the wire cannot carry goes out as null, no expiry: 'infinity', and 10000-01-01 UTC on,
-- the year a client can no longer parse; a past one ('-infinity' included) is left out.
-- Composed with psycopg.sql: the braces of the JSON text are doubled ({{ and }}).
WITH page AS MATERIALIZED (
{page}
), snapshots AS (
    SELECT p.user_id, gen_random_uuid() AS message_id,
           coalesce(s.company_id, %(role_company_id)s::uuid) AS company_id,
           coalesce(s.assignments, '') AS assignments
    FROM page AS p
    LEFT JOIN LATERAL (
        -- CompanyId: the tenant in which the role changed, the user's first assignment (by
        -- id) of the changed role that carries one; else the role's own tenant (above).
        SELECT (array_agg(a.company_id ORDER BY a.id)
                    FILTER (WHERE a.role_id = %(role_id)s AND a.company_id IS NOT NULL))[1]
                   AS company_id,
               string_agg(
                   '{{"AssignmentId":"' || a.id::text
                   || '","RoleId":"' || a.role_id::text
                   || '","RoleCode":' || to_json(r.code)::text
                   || ',"ScopeType":' || to_json(a.scope_type)::text
                   || ',"ScopeOrganizationId":'
                   || coalesce('"' || a.scope_organization_id::text || '"', 'null')
                   || ',"ScopeProjectGroupId":'
                   || coalesce('"' || a.scope_project_group_id::text || '"', 'null')
                   || ',"ScopeProjectId":'
                   || coalesce('"' || a.scope_project_id::text || '"', 'null')
                   || ',"ExpiresAt":'
                   || CASE WHEN a.expires_at < '10000-01-01 00:00:00+00' THEN
                          '"' || to_char(a.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
                          || CASE WHEN date_trunc('second', a.expires_at) = a.expires_at THEN ''
                                  ELSE to_char(a.expires_at AT TIME ZONE 'UTC', '.US') END
                          || 'Z"'
                      ELSE 'null' END
                   || '}}',
                   ',' ORDER BY a.id) AS assignments
        FROM identity.role_assignments AS a
        JOIN identity.role_definitions AS r ON r.id = a.role_id
        WHERE a.user_id = p.user_id
          AND a.status = 'Active'
          AND (a.expires_at IS NULL OR a.expires_at > now())
    ) AS s ON true
), written AS (
    INSERT INTO {outbox}
        (topic, message_key, payload, headers, message_id, event_type, key_slot)
    SELECT %(topic)s,
           e.user_id::text,
           convert_to(
               '{{"MessageId":"' || e.message_id::text
               || '","EventType":' || %(event_type_json)s
               || ',"ContractVersion":' || %(contract_version)s::int
               || ',"OccurredAt":' || %(occurred_at_json)s
               || ',"AggregateType":' || %(aggregate_type_json)s
               || ',"AggregateId":"' || e.user_id::text
               || '","Version":' || %(version)s::bigint
               || ',"CorrelationId":' || %(correlation_id_json)s
               || ',"Payload":{{"UserId":"' || e.user_id::text
               || '","CompanyId":' || coalesce('"' || e.company_id::text || '"', 'null')
               || ',"ChangeReason":' || %(change_reason_json)s
               || ',"ActiveAssignments":[' || e.assignments
               || '],"Version":' || %(version)s::bigint
               || '}}}}',
               'UTF8'),
           jsonb_build_array(
               jsonb_build_array(%(event_type_header)s::text, %(event_type)s::text),
               jsonb_build_array(%(contract_version_header)s::text, %(contract_version)s::text),
               jsonb_build_array(%(message_id_header)s::text, e.message_id::text)
           ) || %(trace_headers)s::jsonb,
           e.message_id,
           %(event_type)s,
           {key_slot}(e.user_id::text)
    FROM snapshots AS e
    -- Clustered by lane: a page's rows of one slot take consecutive ids, so they share heap
    -- pages, and each relay reads and deletes pages of its own lanes instead of every page
    -- of the batch (one row per user: no key's order depends on it).
    ORDER BY {key_slot}(e.user_id::text), e.user_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM written) AS users,
       (SELECT user_id FROM page ORDER BY user_id DESC LIMIT 1) AS last_user
