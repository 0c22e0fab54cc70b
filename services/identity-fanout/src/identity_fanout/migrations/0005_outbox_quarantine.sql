-- Outbox quarantine: rows Kafka or the client refused with a non-retriable error (too large,
-- invalid record, topic authorization). The relay moves such a row here in one statement
-- with its DELETE from identity.outbox, so the rows behind it keep flowing and nothing is
-- lost; an operator lists it and, once the cause is fixed, retries it (back to the tail of
-- the outbox under a new id). See services/identity-fanout/README.md "Quarantine".

CREATE TABLE identity.outbox_quarantine (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_id       bigint      NOT NULL,   -- its id in identity.outbox when it was refused
    topic           text        NOT NULL,
    message_key     text        NOT NULL,
    payload         bytea       NOT NULL,   -- the exact record value, unchanged
    headers         jsonb       NOT NULL,
    message_id      uuid        NOT NULL,
    event_type      text        NOT NULL,
    created_at      timestamptz NOT NULL,   -- when the row (last) entered the outbox
    error_code      text        NOT NULL,   -- the Kafka error name, e.g. MSG_SIZE_TOO_LARGE
    error_reason    text        NOT NULL,   -- too-large, invalid-record, invalid-topic, topic-authorization
    error_message   text        NOT NULL,
    attempts        integer     NOT NULL CHECK (attempts >= 1),
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL CHECK (last_failed_at >= first_failed_at)
);

CREATE INDEX ix_outbox_quarantine_message_id ON identity.outbox_quarantine (message_id);

-- A retried row carries its quarantine history back into the outbox, so a second refusal
-- counts attempts on from there and keeps the first failure's time. 0 / null for every row
-- that was never quarantined (the writers do not name these columns).
ALTER TABLE identity.outbox
    ADD COLUMN quarantine_attempts integer NOT NULL DEFAULT 0 CHECK (quarantine_attempts >= 0),
    ADD COLUMN first_failed_at     timestamptz;
