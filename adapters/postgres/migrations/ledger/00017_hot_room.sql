-- +goose Up
-- Room on the pages of the rows that every posting or publish updates
-- again: an account's revision and balances, a published aggregate's
-- revision, and the relays' leases and heartbeats.
--
-- PostgreSQL updates a row without a new index entry (a HOT update) only
-- when the new version fits on the old one's page. Normally the page's
-- dead versions are pruned as it fills, and nearly every update is HOT
-- whatever the fillfactor. While a long snapshot holds the horizon no
-- version can be pruned: with the default fillfactor (100) the pages of
-- these small, hot tables are full, and every other update goes to
-- another page with a new entry in each index, which every later lookup
-- by the primary key walks. Measured by BenchmarkLedgerWriteUnderASnapshot
-- (8 writers, 1,000 accounts, 4,800 postings under a REPEATABLE READ
-- snapshot): with fillfactor 50, 75-80% of the updates of accounts and
-- account_balances were HOT against 44-54% with the default, and their
-- primary keys ended at 8 and 10 pages against 13 and 17; without the
-- snapshot both were HOT at 99.8-100%, and the postings' rate was the
-- same within noise either way (docs/measured.md). It delays the cost of
-- a pinned horizon; it does not remove it. Half a page per row costs
-- little on tables of a row per account or aggregate.
--
-- ALTER TABLE ... SET (fillfactor) takes a SHARE UPDATE EXCLUSIVE lock,
-- which neither reads nor writes wait for, and applies to pages filled
-- from now on; pages already full get the room at their next rewrite
-- (VACUUM FULL, pg_repack), which is not needed for correctness.
ALTER TABLE accounts SET (fillfactor = 50);
ALTER TABLE account_balances SET (fillfactor = 50);
ALTER TABLE posthorn_aggregates SET (fillfactor = 50);
ALTER TABLE relay_leases SET (fillfactor = 50);
ALTER TABLE relay_cdc_leases SET (fillfactor = 50);
ALTER TABLE relay_members SET (fillfactor = 50);

-- +goose Down
ALTER TABLE relay_members RESET (fillfactor);
ALTER TABLE relay_cdc_leases RESET (fillfactor);
ALTER TABLE relay_leases RESET (fillfactor);
ALTER TABLE posthorn_aggregates RESET (fillfactor);
ALTER TABLE account_balances RESET (fillfactor);
ALTER TABLE accounts RESET (fillfactor);
