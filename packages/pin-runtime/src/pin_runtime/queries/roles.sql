-- Runtime roles and their privileges. `{schema}`, `{role}`, `{member}`, `{table}`, `{database}`
-- and `{roles}` are identifiers, `{privileges}` a list of privilege keywords and `{purpose}` a
-- literal, all composed with psycopg.sql at run time.

-- name: existing --
SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)

-- name: may_create --
-- Who migrates, and whether it may create the missing roles (CREATEROLE or superuser).
SELECT current_user, rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user

-- name: create --
CREATE ROLE {role} NOLOGIN

-- name: describe --
COMMENT ON ROLE {role} IS {purpose}

-- name: inherits --
-- Whether the first role has the privileges of the second (a member of it, inheriting).
SELECT pg_has_role(%s, %s, 'USAGE')

-- name: grant_membership --
GRANT {role} TO {member}

-- name: revoke_tables --
REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role}

-- name: revoke_sequences --
REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role}

-- name: revoke_schema --
REVOKE ALL ON SCHEMA {schema} FROM {role}

-- name: grant_usage --
GRANT USAGE ON SCHEMA {schema} TO {role}

-- name: grant_table --
GRANT {privileges} ON TABLE {table} TO {role}

-- name: connect_grantable --
-- The database, whether CONNECT may be granted on it, and whether its owner migrates (only
-- the owner's revoke from PUBLIC takes PUBLIC's default CONNECT away).
SELECT d.datname,
       has_database_privilege(d.datname, 'CONNECT WITH GRANT OPTION'),
       pg_has_role(current_user, d.datdba, 'MEMBER')
  FROM pg_database AS d
 WHERE d.datname = current_database()

-- name: grant_connect --
GRANT CONNECT ON DATABASE {database} TO {roles}

-- name: revoke_public_connect --
REVOKE CONNECT, TEMPORARY ON DATABASE {database} FROM PUBLIC

-- name: reads_statistics --
-- Whether the role is a member of pg_read_all_stats (directly: that is what this grants).
SELECT EXISTS (SELECT 1 FROM pg_auth_members
                WHERE roleid = 'pg_read_all_stats'::regrole AND member = %s::regrole)

-- name: grant_statistics --
GRANT pg_read_all_stats TO {role}

-- name: revoke_statistics --
REVOKE pg_read_all_stats FROM {role}
