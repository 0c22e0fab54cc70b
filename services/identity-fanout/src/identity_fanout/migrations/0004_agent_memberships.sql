-- Agent memberships in agencies: the identity side of pin.identity.agent-membership-changed.v1.
-- One row per (agent, agency): leaving keeps the row (Left), re-joining reactivates it with
-- Version + 1, so the consumer's per-row guard (Version > LastMembershipVersion) sees one
-- monotonic sequence per pair. Enums are stored as text, each guarded by a CHECK.

CREATE TABLE identity.agent_memberships (
    id              uuid        PRIMARY KEY,                 -- MembershipId = AggregateId
    agent_user_id   uuid        NOT NULL CHECK (agent_user_id <> '00000000-0000-0000-0000-000000000000'),
    company_id      uuid        NOT NULL CHECK (company_id <> '00000000-0000-0000-0000-000000000000'),
    status          text        NOT NULL CHECK (status IN ('Active', 'Left')),
    reason          text                 CHECK (reason IN ('SelfLeave', 'ExcludedByAgency')),
    effective_at    timestamptz,
    joined_at       timestamptz NOT NULL,
    left_at         timestamptz,
    invitation_id   uuid,
    version         bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ux_agent_memberships_agent_company UNIQUE (agent_user_id, company_id),
    -- The producer rules of the event, kept by the table too: Active carries no leave data,
    -- Left carries its reason and both moments.
    CONSTRAINT ck_agent_memberships_active_clean CHECK (
        status <> 'Active' OR (reason IS NULL AND effective_at IS NULL AND left_at IS NULL)
    ),
    CONSTRAINT ck_agent_memberships_left_complete CHECK (
        status <> 'Left' OR (reason IS NOT NULL AND effective_at IS NOT NULL AND left_at IS NOT NULL)
    )
);

-- "Where is this agent a member?" (the display status is derived from an agent's rows).
CREATE INDEX ix_agent_memberships_company_active
    ON identity.agent_memberships (company_id)
    WHERE status = 'Active';
