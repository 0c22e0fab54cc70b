-- Catalogue reads of pin_testkit.databases.

-- name: database_exists --
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = %(name)s)
