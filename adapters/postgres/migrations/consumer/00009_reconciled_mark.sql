-- +goose Up
-- Where reconciliation may start its next pass over a consumer's inbox.
--
-- Every inbox row carries the ID of the transaction that last wrote it
-- (changed_xid: the default on insert, the trigger below on every update,
-- so a held event applied later counts as changed). A clean pass of
-- `posthorn reconcile` records, per consumer, the oldest transaction still
-- running when it started (the xmin of a snapshot it took before reading):
-- every transaction below that mark had ended then, so the pass read all of
-- their rows. The next pass reads only rows changed at or after the mark
-- for the checks that look at the whole inbox (event IDs the ledger does
-- not know, revisions applied twice); an applied-twice pair always has one
-- row the later write changed.
--
-- The mark lives here, beside the rows it speaks of: a restore of this
-- database from a backup takes its mark back with its rows. It names the
-- server it was taken on (a dump restored on another server keeps the rows'
-- transaction IDs but counts new ones from elsewhere) and the ledger's
-- history it was proven against (after a failover the consumers' events
-- are proven again): with either changed, the mark is not used.
--
-- Rows written before this migration have no changed_xid; the first pass
-- after it reads every row, so they lie below any mark it records. Adding
-- a nullable column and a default rewrites nothing, and the index holds
-- only rows with a transaction ID, so the migration is quick on a large
-- inbox.
ALTER TABLE consumer_inbox ADD COLUMN changed_xid xid8;
ALTER TABLE consumer_inbox ALTER COLUMN changed_xid SET DEFAULT pg_current_xact_id();

CREATE INDEX consumer_inbox_changed ON consumer_inbox (consumer, changed_xid, event_id)
    WHERE changed_xid IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION consumer_inbox_changed() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER consumer_inbox_changed BEFORE UPDATE ON consumer_inbox
    FOR EACH ROW EXECUTE FUNCTION consumer_inbox_changed();

-- One mark per consumer, written only by the reconciler's role (roles/
-- consumer.sql): a consumer that could move its own mark could hide its
-- rows from the next pass.
CREATE TABLE consumer_reconciled (
    consumer       text        PRIMARY KEY,
    mark           xid8        NOT NULL,
    server         bigint      NOT NULL,
    ledger_history text        NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE consumer_reconciled;
DROP TRIGGER consumer_inbox_changed ON consumer_inbox;
DROP FUNCTION consumer_inbox_changed();
DROP INDEX consumer_inbox_changed;
ALTER TABLE consumer_inbox DROP COLUMN changed_xid;
