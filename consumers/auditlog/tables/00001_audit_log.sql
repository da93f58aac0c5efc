-- +goose Up
-- The audit log: every event as received. IF NOT EXISTS: consumer databases
-- migrated before this table moved beside its consumer got it from the
-- consumer schema's first migration, rows and all.
CREATE TABLE IF NOT EXISTS audit_log (
    event_id       text        PRIMARY KEY,
    type           text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    revision       bigint      NOT NULL,
    journal_id     text,
    occurred_at    timestamptz,
    replay         boolean     NOT NULL DEFAULT false,
    payload        jsonb       NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE audit_log;
