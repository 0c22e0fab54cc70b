-- Each writing transaction also shows, in pg_locks, the first outbox id it took: a shared
-- transaction-level advisory lock `(first-id class + id >> 32, low 32 bits of the id)`,
-- taken once per transaction, right after that id. Its rows all have ids from there on,
-- so a relay's frontier step settles a slot up to the lowest first id of its open writers
-- at once, instead of waiting for every writer it saw to end and looking again
-- (identity_fanout.outbox.frontier). A writer seen before it shows its first id is waited
-- for as before. The class is `lock_class("pin-outbox-first-id:identity.outbox")`
-- (OutboxTables.first_id_lock_class, checked by a test).
--
-- "Once per transaction" is a transaction-local setting: a rolled-back savepoint undoes the
-- setting with its rows and lock; a session that set it for good only makes its
-- transactions wait as a writer without a first id does.

CREATE OR REPLACE FUNCTION identity.outbox_row_id() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(575313526, NEW.key_slot);
    NEW.id := pg_catalog.nextval('identity.outbox_id_seq'::regclass);
    IF coalesce(pg_catalog.current_setting('pin.outbox_first_id', true), '') = '' THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(
            1306112985 + (NEW.id >> 32)::int, (NEW.id::bit(32))::int);
        PERFORM pg_catalog.set_config('pin.outbox_first_id', NEW.id::text, true);
    END IF;
    RETURN NEW;
END
$$;
