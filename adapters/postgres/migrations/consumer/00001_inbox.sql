-- +goose Up
-- Placeholder: the consumers' inbox and projections are defined by the consumers work.
SELECT 1;
-- +goose Down
SELECT 1;
