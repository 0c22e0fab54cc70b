-- The audit of discarded quarantine rows: one row per quarantined outbox row an operator
-- deleted for good (`identity-fanout outbox quarantine discard`), written by the same
-- statement that deletes it, so no row leaves the quarantine without its audit row. For an
-- access event a discard may drop a revocation: who did it, when and why must outlast the
-- log pipeline's retention. Append-only for the runtime roles (the operator's role may
-- INSERT, nothing else). The payload is not kept: the ids name the event, and the refusal
-- says why it could not go out. See services/identity-fanout/README.md "Quarantine".

CREATE TABLE identity.outbox_quarantine_discards (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    discarded_at   timestamptz NOT NULL DEFAULT statement_timestamp(),
    quarantine_id  bigint      NOT NULL,   -- its id in identity.outbox_quarantine
    outbox_id      bigint      NOT NULL,   -- its id in identity.outbox when it was refused
    topic          text        NOT NULL,
    message_key    text        NOT NULL,   -- the UserId / AgentUserId
    message_id     uuid        NOT NULL,
    event_type     text        NOT NULL,
    error_code     text        NOT NULL,   -- why Kafka refused it, as quarantined
    error_reason   text        NOT NULL,
    attempts       integer     NOT NULL,
    forced         boolean     NOT NULL,   -- --force given (required for an access event)
    reason         text        NOT NULL CHECK (btrim(reason) <> ''),   -- the operator's --reason
    database_login text        NOT NULL,   -- session_user: who logged in
    database_role  text        NOT NULL,   -- current_user: the role the delete ran as
    os_user        text        NOT NULL,   -- the CLI process's OS user
    host           text        NOT NULL    -- where the CLI ran (the ops pod)
);

CREATE INDEX ix_outbox_quarantine_discards_message_key
    ON identity.outbox_quarantine_discards (message_key);
