-- rewards.agent_performance as the consumer sees it: the membership columns of a row
-- (MembershipRow), never the earned metrics. A batch reads and writes its rows within ONE
-- statement together with the inbox (`apply_batch`, batch.sql).

-- name: probe --
-- The recovery probe after an outage: does the database answer again?
SELECT 1
