-- Outbox lanes: several relay instances publish at once, each the rows of the lanes it holds.
-- Every row carries the slot of its message key (0..63), computed by the writer when the row
-- is written and never changed: a lane is a group of slots (slot % lanes), and a relay
-- publishes a slot only while it holds that slot's advisory lock, so one key has one
-- publisher at a time. See services/identity-fanout/README.md "Relay lanes".

-- The writer's function (identity_fanout.lanes.key_slot), for the rows already waiting and
-- for anyone inserting by hand.
CREATE FUNCTION identity.outbox_key_slot(message_key text) RETURNS smallint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT (get_byte(sha256(convert_to(message_key, 'UTF8')), 0) % 64)::smallint $$;

ALTER TABLE identity.outbox ADD COLUMN key_slot smallint;
UPDATE identity.outbox SET key_slot = identity.outbox_key_slot(message_key);
ALTER TABLE identity.outbox
    ALTER COLUMN key_slot SET NOT NULL,
    ADD CONSTRAINT outbox_key_slot_range CHECK (key_slot BETWEEN 0 AND 63);

-- A lane's head in id order: `key_slot = ANY(<the lane's slots>) AND id > <cursor>`.
CREATE INDEX ix_outbox_key_slot_id ON identity.outbox (key_slot, id);

-- A quarantined row keeps its slot, and goes back to it when retried.
ALTER TABLE identity.outbox_quarantine ADD COLUMN key_slot smallint;
UPDATE identity.outbox_quarantine SET key_slot = identity.outbox_key_slot(message_key);
ALTER TABLE identity.outbox_quarantine ALTER COLUMN key_slot SET NOT NULL;
