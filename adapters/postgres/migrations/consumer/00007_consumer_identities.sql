-- +goose Up
-- Which database role answers for which consumer. A consumer's inbox rows,
-- positions and retention horizon are written only by members of its role
-- (row-level security, installed with the grants by `posthorn migrate
-- --consumer --roles`): a role that runs one consumer cannot record a
-- disposition in another's name, so it cannot make that consumer count a
-- real event as a duplicate, nor delete or move its rows.
--
-- The role is derived from the name (posthorn_consumer_ and the name with
-- every character outside [a-z0-9] as '_'); the UNIQUE constraint refuses
-- a second name that would share a role, so the mapping stays one-to-one.
CREATE TABLE consumer_identities (
    consumer      text        PRIMARY KEY CHECK (consumer <> ''),
    role          name        NOT NULL UNIQUE CHECK (role ~ '^posthorn_consumer_[a-z0-9_]+$'),
    registered_at timestamptz NOT NULL DEFAULT now()
);

-- The example consumers `posthorn consume` runs.
INSERT INTO consumer_identities (consumer, role) VALUES
    ('balance-projection', 'posthorn_consumer_balance_projection'),
    ('audit-log', 'posthorn_consumer_audit_log');

-- +goose Down
ALTER TABLE consumer_inbox DISABLE ROW LEVEL SECURITY;
ALTER TABLE consumer_positions DISABLE ROW LEVEL SECURITY;
ALTER TABLE consumer_retention DISABLE ROW LEVEL SECURITY;
-- CASCADE: the roles' policies read the table.
DROP TABLE consumer_identities CASCADE;
