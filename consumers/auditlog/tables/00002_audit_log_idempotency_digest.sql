-- +goose Up
-- The audit log keeps each ledger event's idempotency digest (header
-- idempotency_digest) with the event: posthorn failover check reads it
-- back, so a posting a ledger failover lost gets its key restored (or
-- refused for good) from the audit log alone, with no sink to read.
-- Events written before the ledger sent the header keep NULL.
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS idempotency_digest text;

-- +goose Down
ALTER TABLE audit_log DROP COLUMN idempotency_digest;
