-- What holds this database's xmin horizon back (pin_runtime.horizon): the oldest holder of
-- every kind. VACUUM may not remove a row deleted after the horizon, and an index scan may
-- not mark its entry dead, so a statement reading a queue table (an outbox) from its head
-- walks those rows again at every run.

-- name: oldest_holder --
-- Sessions of this database holding a snapshot (backend_xmin: another role's is NULL, so
-- unseen, unless this login is a member of pg_read_all_stats), prepared transactions, and
-- replication slots (a physical slot's xmin holds every database, a logical slot's
-- catalog_xmin the catalogs), the oldest by transaction age. `age_seconds`: since when the
-- server knows the hold (a session's transaction start, a preparation); NULL for a slot,
-- which has no such time (the collector counts from when it first saw the slot's xmin).
-- Always one row: the database, and NULLs when nothing holds its horizon.
SELECT d.datname, h.kind, h.holder, h.user_name, h.application_name, h.state, h.xmin,
       h.xid_age, extract(epoch FROM clock_timestamp() - h.since)::float8 AS age_seconds
  FROM (SELECT current_database() AS datname) AS d
  LEFT JOIN (SELECT * FROM (
        SELECT 'session' AS kind, a.pid::text AS holder,
               coalesce(a.usename::text, '') AS user_name,
               coalesce(a.application_name, '') AS application_name,
               coalesce(a.state, '') AS state, a.backend_xmin::text AS xmin,
               age(a.backend_xmin)::bigint AS xid_age,
               coalesce(a.xact_start, a.query_start, a.backend_start) AS since
          FROM pg_stat_activity AS a
         WHERE a.backend_xmin IS NOT NULL
           AND a.pid <> pg_backend_pid()
           AND a.datname = current_database()
        UNION ALL
        SELECT 'prepared', p.gid, p.owner::text, '', 'prepared', p.transaction::text,
               age(p.transaction)::bigint, p.prepared
          FROM pg_prepared_xacts AS p
         WHERE p.database = current_database()
        UNION ALL
        SELECT 'slot', s.slot_name::text, '', '',
               CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
               coalesce(s.xmin, s.catalog_xmin)::text,
               greatest(age(s.xmin), age(s.catalog_xmin))::bigint, NULL::timestamptz
          FROM pg_replication_slots AS s
         WHERE (s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL)
           AND (s.database IS NULL OR s.database = current_database())
       ) AS holders
        ORDER BY xid_age DESC
        LIMIT 1) AS h ON true
