-- +goose Up
-- Idempotency keys expire (adapters/postgres/retention.go):
-- deleted oldest first in small batches through this index.
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);

-- +goose Down
DROP INDEX idempotency_keys_created_at;
