-- +goose Up
-- Each clean reconciliation pass leaves a witness on the ledger: a fresh
-- random value written with the consumer's coverage, after the pass read
-- everything it proved. The pass records the same value with its mark in
-- the consumer's database. After a failover the promoted standby holds the
-- witness only if it replayed the pass's write, and WAL is replayed in
-- order: then it holds every commit the pass saw, so every event the pass
-- proved is on it, and the failover check may read that consumer from its
-- mark instead of whole. A missing or other witness proves nothing, and the
-- consumer is read whole. A nullable column without a default rewrites
-- nothing.
ALTER TABLE ops_coverage ADD COLUMN witness uuid;

-- +goose Down
ALTER TABLE ops_coverage DROP COLUMN witness;
