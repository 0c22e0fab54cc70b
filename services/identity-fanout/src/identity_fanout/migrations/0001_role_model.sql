-- Role model of the identity context: the part the access fan-out reads.
-- Enums are stored as text (the spec's decision), each guarded by a CHECK.

CREATE TABLE identity.role_definitions (
    id          uuid        PRIMARY KEY,
    company_id  uuid,                       -- null: a platform system role
    code        text        NOT NULL CHECK (code <> ''),
    version     bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    status      text        NOT NULL DEFAULT 'Active' CHECK (status IN ('Active', 'Archived')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One code per tenant; system roles (company_id null) share one namespace.
CREATE UNIQUE INDEX ux_role_definitions_company_code
    ON identity.role_definitions (coalesce(company_id, '00000000-0000-0000-0000-000000000000'), code);

-- The permission catalogue: set-role-permissions rejects codes that are not in it.
CREATE TABLE identity.permissions (
    code        text        PRIMARY KEY CHECK (code <> ''),
    description text        NOT NULL DEFAULT ''
);

CREATE TABLE identity.role_permissions (
    role_id         uuid        NOT NULL REFERENCES identity.role_definitions (id) ON DELETE CASCADE,
    permission_code text        NOT NULL REFERENCES identity.permissions (code) ON DELETE RESTRICT,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role_id, permission_code)
);

CREATE TABLE identity.role_assignments (
    id                      uuid        PRIMARY KEY,
    role_id                 uuid        NOT NULL REFERENCES identity.role_definitions (id) ON DELETE RESTRICT,
    user_id                 uuid        NOT NULL CHECK (user_id <> '00000000-0000-0000-0000-000000000000'),
    company_id              uuid,
    status                  text        NOT NULL DEFAULT 'Active'
                                        CHECK (status IN ('Active', 'Revoked', 'Expired')),
    scope_type              text        NOT NULL
                                        CHECK (scope_type IN ('Company', 'Organization', 'ProjectGroup', 'Project')),
    scope_organization_id   uuid,
    scope_project_group_id  uuid,
    scope_project_id        uuid,
    expires_at              timestamptz,
    version                 bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

-- The fan-out page: distinct user_id of a role's Active assignments after the cursor, in
-- user_id order. Only Active rows are indexed, so the keyset walk reads the index alone.
CREATE INDEX ix_role_assignments_role_active_user
    ON identity.role_assignments (role_id, user_id)
    WHERE status = 'Active';

-- The snapshot: every Active assignment of a page of users, with what the event carries,
-- so one query per page is an index-only scan plus the role lookup for RoleCode.
CREATE INDEX ix_role_assignments_user_active
    ON identity.role_assignments (user_id)
    INCLUDE (id, role_id, company_id, scope_type, scope_organization_id,
             scope_project_group_id, scope_project_id, expires_at)
    WHERE status = 'Active';
