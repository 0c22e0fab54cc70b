-- One agent's projection rows, for `agent show`.

-- name: agent_rows --
-- Every row of one agent ({columns}: the fields of AgentRow), by agency.
SELECT {columns}
FROM rewards.agent_performance
WHERE agent_user_id = %(agent)s
ORDER BY company_id
