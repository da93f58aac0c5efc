-- +goose Up
-- The relay's read skips what it has already marked without walking it.
--
-- A marker deletes the row's outbox_pending entry, and while any snapshot
-- older than the delete lives (a report, pg_dump, a standby's
-- hot_standby_feedback) VACUUM cannot remove it: a read that scans a
-- shard's queue from its start walks every such entry again, and its cost
-- grows with the snapshot's age. The relay now starts each shard's scan at
-- a low-water mark below which every row is relayed (or belongs to a
-- parked aggregate), and raises the mark only past ids that no
-- transaction can still insert: a row becomes visible late when its
-- transaction took its id and commits later, so the relay records, with
-- each read, the last id the sequence gave out (L) and then the next
-- transaction ID to be assigned (M), and trusts L once every transaction
-- below M has ended (the oldest running one, pg_snapshot_xmin, is at or
-- past M): every row with an id up to L was then committed and visible, or
-- rolled back. That holds only if each transaction has its transaction ID
-- before it takes an outbox id: the default below makes sure of it (every
-- writer but a bare INSERT had one already), and the sequence hands out
-- one value at a time in order.
ALTER SEQUENCE outbox_id_seq CACHE 1;
ALTER TABLE outbox ALTER COLUMN id SET DEFAULT
    CASE WHEN pg_catalog.pg_current_xact_id() IS NOT NULL THEN pg_catalog.nextval('public.outbox_id_seq'::regclass) END;

-- A released (or dead-lettered) aggregate's held rows lie below the mark:
-- every delete of a park moves this sequence, and a relay that sees it
-- move reads each shard from its start once.
CREATE SEQUENCE relay_release_seq;

-- +goose StatementBegin
CREATE FUNCTION relay_parked_released() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_catalog.nextval('public.relay_release_seq'::regclass);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER relay_parked_released AFTER DELETE ON relay_parked
    FOR EACH STATEMENT EXECUTE FUNCTION relay_parked_released();

-- +goose Down
DROP TRIGGER relay_parked_released ON relay_parked;
DROP FUNCTION relay_parked_released();
DROP SEQUENCE relay_release_seq;
ALTER TABLE outbox ALTER COLUMN id SET DEFAULT pg_catalog.nextval('public.outbox_id_seq'::regclass);
