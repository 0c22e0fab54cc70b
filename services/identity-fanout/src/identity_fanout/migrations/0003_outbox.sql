-- Transactional outbox: rows commit with the change that caused them; the relay publishes
-- them after commit, in id order, and deletes a row only once the broker acknowledged it.

CREATE TABLE identity.outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic           text        NOT NULL,
    message_key     text        NOT NULL,
    payload         bytea       NOT NULL,   -- the exact record value (contract envelope)
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    message_id      uuid        NOT NULL,
    event_type      text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
