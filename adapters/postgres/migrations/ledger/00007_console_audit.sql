-- +goose Up
-- The operator console's audit log (adapters/postgres/console.go):
-- one row per action an operator confirmed with the console token, written
-- (outcome 'started') before the action runs, so no action goes unrecorded,
-- and finished with its outcome afterwards. Refused requests (bad token,
-- bad CSRF token, bad input) change nothing and write no row. No component
-- role may delete from it (roles/ledger.sql).
CREATE TABLE console_audit (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    operator    text NOT NULL,
    remote_addr text NOT NULL,
    action      text NOT NULL,
    target      text NOT NULL,
    outcome     text NOT NULL DEFAULT 'started' CHECK (outcome IN ('started', 'ok', 'failed')),
    detail      text NOT NULL DEFAULT '',
    finished_at timestamptz
);

-- +goose Down
DROP TABLE console_audit;
