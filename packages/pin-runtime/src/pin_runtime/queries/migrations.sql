-- The numbered files' bookkeeping. `{schema}` and `{table}` are identifiers composed with
-- psycopg.sql at run time (the schema is the service's).

-- name: lock --
-- One migrating process per schema at a time, in every process and language.
SELECT pg_advisory_lock(%s)

-- name: unlock --
SELECT pg_advisory_unlock(%s)

-- name: create_schema --
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: create_history --
-- `checksum`: sha256 of the file's bytes, hex; an edited applied file is refused.
CREATE TABLE IF NOT EXISTS {table} (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: applied --
SELECT version, name, checksum FROM {table}

-- name: record --
-- In the same transaction as the file it records.
INSERT INTO {table} (version, name, checksum) VALUES (%s, %s, %s)
