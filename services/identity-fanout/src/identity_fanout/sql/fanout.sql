-- What a batch reads of the role model: the page of a role's users and their snapshots.

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

-- name: snapshot_rows --
-- Every Active, unexpired assignment of a page of users, with the role code: the snapshot
-- of each user in one query (no N+1). An assignment whose ExpiresAt has passed is left out
-- even before the expiry job marks it Expired: the snapshot must never extend access.
SELECT a.user_id, a.id AS assignment_id, a.role_id, r.code AS role_code, a.company_id,
       a.scope_type, a.scope_organization_id, a.scope_project_group_id, a.scope_project_id,
       a.expires_at
FROM identity.role_assignments AS a
JOIN identity.role_definitions AS r ON r.id = a.role_id
WHERE a.user_id = ANY(%(user_ids)s)
  AND a.status = 'Active'
  AND (a.expires_at IS NULL OR a.expires_at > now())
ORDER BY a.user_id, a.id

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
