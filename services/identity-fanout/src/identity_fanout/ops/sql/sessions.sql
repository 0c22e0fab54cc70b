-- The service's processes as the database sees them (`identity-fanout status`).

-- name: worker_sessions --
-- Live worker processes: each names every session it opens `identity-fanout-worker@HOST:PID`
-- (fanout.worker.worker_session_name), its pool's and its LISTEN's. application_name is
-- shown to every login, without pg_read_all_stats; this database's sessions only.
SELECT application_name AS name, count(*)::integer AS sessions
FROM pg_stat_activity
WHERE datname = current_database() AND starts_with(application_name, %(prefix)s)
GROUP BY application_name
ORDER BY application_name
