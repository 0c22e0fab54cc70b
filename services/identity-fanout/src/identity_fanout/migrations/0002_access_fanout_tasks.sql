-- The queue of the access fan-out (spec: AccessFanOutTask).

CREATE TABLE identity.access_fanout_tasks (
    id                uuid        PRIMARY KEY,
    role_id           uuid        NOT NULL REFERENCES identity.role_definitions (id) ON DELETE RESTRICT,
    company_id        uuid,
    role_version      bigint      NOT NULL CHECK (role_version >= 1),
    reason            text        NOT NULL,
    status            text        NOT NULL DEFAULT 'Pending'
                                  CHECK (status IN ('Pending', 'InProgress', 'Completed', 'Failed')),
    cursor            uuid,       -- last UserId fanned out; null: from the start
    processed_count   integer     NOT NULL DEFAULT 0 CHECK (processed_count >= 0),
    attempt_count     integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    lease_expires_at  timestamptz,
    last_error        text,       -- why the last attempt failed, for the poison runbook
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    completed_at      timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX ix_access_fanout_tasks_role_id ON identity.access_fanout_tasks (role_id);
CREATE INDEX ix_access_fanout_tasks_company_id ON identity.access_fanout_tasks (company_id);

-- The claim and the backlog gauge look only at live tasks, in CreatedAt order; finished
-- tasks (the vast majority over time) stay out of this index.
CREATE INDEX ix_access_fanout_tasks_pending
    ON identity.access_fanout_tasks (created_at)
    WHERE status IN ('Pending', 'InProgress');

-- Failed (poison) tasks are few and looked up by the runbook and the alert gauge.
CREATE INDEX ix_access_fanout_tasks_failed
    ON identity.access_fanout_tasks (created_at)
    WHERE status = 'Failed';
