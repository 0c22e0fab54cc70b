-- A newer version of a role supersedes the remaining work of its older fan-out tasks: the
-- newer snapshot reaches every user the older one had not reached yet, so the older task
-- stops where it is (Completed, with the version that covers the rest) instead of running
-- beside the newer one and delivering the role's versions out of order.

ALTER TABLE identity.access_fanout_tasks
    ADD COLUMN superseded_by_version bigint
        CHECK (superseded_by_version IS NULL OR superseded_by_version > role_version);

-- The supersede on every permission change looks up the role's live (and Failed) tasks.
CREATE INDEX ix_access_fanout_tasks_role_unfinished
    ON identity.access_fanout_tasks (role_id)
    WHERE status IN ('Pending', 'InProgress', 'Failed');
