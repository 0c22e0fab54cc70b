"""The consumer's rules, pure: a record's `validation` into a typed change or the reason it
is invalid, the per-row version `guard` and transition, a whole batch's `plan` in consume
order, and the agent's `display` status derived on read."""
