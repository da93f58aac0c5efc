-- +goose Up
-- Room on the pages of projection_balances, whose row per account and
-- currency every applied event updates again: see the consumer schema's
-- migration 00008 (the same for consumer_positions) and the ledger's 00017.
ALTER TABLE projection_balances SET (fillfactor = 50);

-- +goose Down
ALTER TABLE projection_balances RESET (fillfactor);
