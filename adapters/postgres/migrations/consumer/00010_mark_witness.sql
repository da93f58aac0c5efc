-- +goose Up
-- What lets the failover check read a consumer from its reconciliation
-- mark (ledger migration 00021) instead of every row it ever recorded.
--
-- ledger_witness: the witness the mark's pass wrote with the consumer's
-- coverage on the ledger. The check reads from the mark only when the
-- ledger it checks holds that same witness.
--
-- pruned_xid: the newest changed_xid retention ever deleted, recorded in
-- the statement that deletes. The audit log's rows are found from the mark
-- through their inbox rows; once retention has deleted a row changed at or
-- after the mark, that is no longer every row since the mark, and the
-- check reads whole.
ALTER TABLE consumer_reconciled ADD COLUMN ledger_witness uuid;
ALTER TABLE consumer_retention ADD COLUMN pruned_xid xid8;

-- +goose Down
ALTER TABLE consumer_retention DROP COLUMN pruned_xid;
ALTER TABLE consumer_reconciled DROP COLUMN ledger_witness;
