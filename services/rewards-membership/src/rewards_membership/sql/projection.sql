-- rewards.agent_performance as the consumer sees it: the membership columns of a row
-- (MembershipRow), never the earned metrics. A batch reads and writes its rows within ONE
-- statement together with the inbox (`apply_batch`, batch.sql).

-- name: probe --
-- The recovery probe after an outage: does the database answer again?
SELECT 1

-- name: local_lock_timeout --
-- The lock timeout of the current transaction alone (SET LOCAL): a batch's part applied for
-- one partition after a lock timeout waits this long for a row, not the session's timeout.
SELECT set_config('lock_timeout', %(lock_timeout)s, true)
