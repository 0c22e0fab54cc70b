-- identity.agent_memberships: one row per (agent, agency), the state the last event announced.
-- {columns} and {values} are composed from identity_fanout.membership.decisions.Membership,
-- the one place its column list is written.

-- name: lock_membership --
-- The pair's row, locked for the whole change (FOR UPDATE).
SELECT {columns} FROM identity.agent_memberships
WHERE agent_user_id = %(agent_user_id)s AND company_id = %(company_id)s
FOR UPDATE

-- name: insert_membership --
-- A concurrent first join of the same pair wins the unique key; the loser sees no row
-- returned, locks the winner's row and decides again (it is then "already Active").
INSERT INTO identity.agent_memberships ({columns}) VALUES ({values})
ON CONFLICT (agent_user_id, company_id) DO NOTHING
RETURNING id

-- name: update_membership --
-- The row is locked above, so the version condition is a guard against a bug, not a race.
UPDATE identity.agent_memberships
   SET ({columns}) = ({values}), updated_at = now()
 WHERE id = %(id)s AND version = %(version)s - 1
