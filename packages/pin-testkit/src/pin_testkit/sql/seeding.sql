-- Synthetic identity role data (pin_testkit.seeding): the demo, the benchmarks and the tests.

-- name: add_permissions --
INSERT INTO identity.permissions (code) SELECT unnest(%(codes)s::text[])
ON CONFLICT DO NOTHING

-- name: add_role --
INSERT INTO identity.role_definitions (id, company_id, code, status)
VALUES (%(id)s, %(company_id)s, %(code)s, %(status)s)

-- name: add_role_permissions --
INSERT INTO identity.role_permissions (role_id, permission_code)
SELECT %(role_id)s, unnest(%(codes)s::text[])

-- name: copy_assignments --
-- COPY: the benchmark seeds 150,000 assignments, and row-by-row inserts would time the
-- seeding instead of the fan-out. {columns}: pin_testkit.seeding.Assignment's fields.
COPY identity.role_assignments ({columns}) FROM STDIN (FORMAT BINARY)
