-- +goose Up
-- Room on the pages of consumer_positions, whose row per consumer and
-- aggregate every applied event updates again (its last revision): with
-- the default fillfactor (100) its pages are full and every other update
-- goes to another page with a new primary key entry, which a long
-- snapshot keeps from being pruned. The ledger's migration 00017 does the
-- same for accounts and balances and says what it measured. The lock
-- taken (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes.
ALTER TABLE consumer_positions SET (fillfactor = 50);

-- +goose Down
ALTER TABLE consumer_positions RESET (fillfactor);
