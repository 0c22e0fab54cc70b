-- The user-centric projection of an agent's performance, one row per (agent, agency).
-- The membership consumer owns the membership columns only; the earned metrics belong to
-- other sources (deals, fixations, accruals) and survive a leave (ADR-0061 p.5, ADR-0070 p.6).
-- Not tenant-scoped: processing runs as a platform-scope system actor.

CREATE TABLE rewards.agent_performance (
    agent_user_id            uuid        NOT NULL,
    company_id               uuid        NOT NULL,   -- the agency
    -- Null until a membership event reached the row (another source may create it first).
    membership_status        text        CHECK (membership_status IN ('Active', 'Left')),
    leave_reason             text        CHECK (leave_reason IN ('SelfLeave', 'ExcludedByAgency')),
    left_at                  timestamptz,
    effective_at             timestamptz,
    first_activity_at        timestamptz,
    last_activity_at         timestamptz,
    -- The per-row monotonic guard: an event applies only when its Version is greater.
    last_membership_version  bigint      NOT NULL DEFAULT 0 CHECK (last_membership_version >= 0),

    -- Earned metrics: never written by the membership consumer.
    deals_closed_count       bigint      NOT NULL DEFAULT 0,
    fixations_count          bigint      NOT NULL DEFAULT 0,
    commission_accrued_amount numeric(20, 2) NOT NULL DEFAULT 0,
    commission_paid_amount   numeric(20, 2) NOT NULL DEFAULT 0,

    -- Row version (optimistic concurrency of the entity): +1 per applied change.
    version                  bigint      NOT NULL DEFAULT 0 CHECK (version >= 0),
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_user_id, company_id)
);

COMMENT ON TABLE rewards.agent_performance IS
    'Per (agent, agency) projection; display status (independent / in agency N) is derived on read';
