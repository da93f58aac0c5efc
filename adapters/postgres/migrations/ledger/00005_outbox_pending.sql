-- +goose Up
-- The relay's work queue moves out of the outbox into outbox_pending: one
-- narrow row (shard, id) per outbox row that no sink has ACKed yet. The
-- marker is the deletion of that row.
--
-- Why: the marker used to be an UPDATE of the outbox row (relayed_at). That
-- column is in the predicate of the work queue's partial index, so the
-- update could never be HOT: each marker wrote a new copy of the whole row
-- (payload included) and a new entry into every outbox index, which made
-- the marker the relay's bottleneck (about 12 µs of database CPU per row,
-- and much more while the copies extended the table). Deleting a pending
-- row writes no new tuple and no index entry (measured: 10x cheaper), and
-- the outbox becomes append-only (until cleanup), so it never bloats.
--
-- Invariant: an outbox row is relayed exactly when it has no pending row.
-- The trigger below makes every insert into the outbox enqueue its rows in
-- the same statement, whoever the writer, so no path can create a row that
-- looks relayed without having been sent.

-- Inserts into the outbox wait until the queue is filled and the trigger
-- is in place (CREATE TRIGGER takes this lock too; taking it first makes
-- the copy below complete).
LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE;

-- Rows come and go at the posting rate; vacuum it by a fixed number of dead
-- rows rather than a fraction of a table that is small most of the time,
-- so the relay's range scans do not walk long runs of deleted entries.
CREATE TABLE outbox_pending (
    shard int    NOT NULL,
    id    bigint NOT NULL,
    PRIMARY KEY (shard, id)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 20000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 20000);

INSERT INTO outbox_pending (shard, id) SELECT shard, id FROM outbox WHERE relayed_at IS NULL;

-- One statement-level trigger per INSERT (the write path inserts all rows of
-- a posting in one statement), not one call per row. It runs with the
-- inserting role's rights: posthorn_api may insert pending rows but not
-- delete them, so it cannot mark anything relayed.
-- +goose StatementBegin
CREATE FUNCTION outbox_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_pending (shard, id) SELECT shard, id FROM enqueued;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_enqueue AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS enqueued
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_enqueue();

DROP INDEX outbox_unrelayed;
ALTER TABLE outbox DROP COLUMN relayed_at, DROP COLUMN relay_token;

-- +goose Down
LOCK TABLE outbox IN SHARE ROW EXCLUSIVE MODE;
ALTER TABLE outbox ADD COLUMN relayed_at timestamptz, ADD COLUMN relay_token bigint;
UPDATE outbox o SET relayed_at = now()
WHERE NOT EXISTS (SELECT 1 FROM outbox_pending p WHERE p.shard = o.shard AND p.id = o.id);
CREATE INDEX outbox_unrelayed ON outbox (shard, id) WHERE relayed_at IS NULL;
DROP TRIGGER outbox_enqueue ON outbox;
DROP FUNCTION outbox_enqueue();
DROP TABLE outbox_pending;
