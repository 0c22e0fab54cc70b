-- set-role-permissions: the role, its permission set and its Version.

-- name: lock_role --
SELECT company_id, status, version FROM identity.role_definitions WHERE id = %(id)s FOR UPDATE

-- name: current_permissions --
SELECT permission_code FROM identity.role_permissions WHERE role_id = %(id)s

-- name: unknown_permissions --
-- The requested codes the permission catalogue does not know, sorted for the error message.
SELECT code FROM unnest(%(codes)s::text[]) AS wanted(code)
WHERE NOT EXISTS (SELECT 1 FROM identity.permissions p WHERE p.code = wanted.code)
ORDER BY code

-- name: replace_permissions --
WITH removed AS (
    DELETE FROM identity.role_permissions
    WHERE role_id = %(id)s AND NOT permission_code = ANY(%(codes)s)
)
INSERT INTO identity.role_permissions (role_id, permission_code)
SELECT %(id)s, code FROM unnest(%(codes)s::text[]) AS wanted(code)
ON CONFLICT DO NOTHING

-- name: bump_version --
UPDATE identity.role_definitions SET version = version + 1, updated_at = now()
WHERE id = %(id)s RETURNING version

-- name: role_summary --
-- `roles show`: the role as an operator looks it up ({columns}: enqueue.RoleSummary).
SELECT {columns} FROM identity.role_definitions WHERE id = %(id)s
