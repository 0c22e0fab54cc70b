"""PIN rewards: the consumer of AgentMembershipChanged and the agent_performance projection."""
