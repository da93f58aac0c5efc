-- +goose Up
-- Inbox retention (adapters/postgres/retention.go). Final rows
-- (applied, duplicate) are scanned oldest first in small batches; this
-- partial index keeps each batch a short index range scan even on a large
-- inbox, and leaves held and parked rows out (they are never pruned).
CREATE INDEX consumer_inbox_final_age ON consumer_inbox (consumer, updated_at, event_id)
    WHERE disposition IN ('applied', 'duplicate');

-- What retention has removed, per consumer, so that reconciliation can tell
-- a pruned disposition (proven by an earlier run) from a missing one.
--   ordered_before:   rows of aggregates with a position were pruned when
--                     below the position's revision and last touched before it;
--   unordered_before: rows without a position were pruned when last touched
--                     before it (the replay window plus a margin).
CREATE TABLE consumer_retention (
    consumer         text        PRIMARY KEY,
    ordered_before   timestamptz NOT NULL,
    unordered_before timestamptz NOT NULL,
    deleted_rows     bigint      NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE consumer_retention;
DROP INDEX consumer_inbox_final_age;
