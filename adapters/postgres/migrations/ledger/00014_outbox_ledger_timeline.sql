-- +goose Up
-- Every outbox row records the timeline of the ledger's history it was
-- written on (posthorn.ledger_history's), and the relay puts it on the wire
-- as the header ledger_timeline. After a failover, the records of the old
-- and the new primary differ in it: a consumer, the failover check or an
-- auditor can tell which history a record came from, and a record whose
-- timeline the accepted history does not descend from stands out.
--
-- The column has no default for the rows already there (adding a default
-- that reads the WAL position would rewrite the whole table): they read
-- NULL, "written before timelines were recorded", and carry no header. The
-- default for new rows is stored as an expression bound now, so a caller's
-- search_path cannot change it; it runs with the inserting role's rights,
-- and pg_current_wal_lsn and pg_walfile_name are PUBLIC's.
ALTER TABLE outbox ADD COLUMN ledger_timeline int CHECK (ledger_timeline >= 1);
ALTER TABLE outbox ALTER COLUMN ledger_timeline SET DEFAULT
    (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int);

-- +goose Down
ALTER TABLE outbox DROP COLUMN ledger_timeline;
