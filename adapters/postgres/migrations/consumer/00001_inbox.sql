-- +goose Up
-- The consumers' inbox and their per-aggregate positions. Everything a
-- consumer writes for one event commits in one transaction with its inbox
-- row. The example consumers' own tables (projection_balances, audit_log)
-- were created here too; they now migrate from files beside those consumers
-- (consumers/projection/tables, consumers/auditlog/tables), which create
-- them only where this migration did not.

-- One row per (consumer, event ID): the event's disposition. The primary key
-- is what makes "apply once" hold when two instances of a consumer receive
-- the same event concurrently: the second INSERT blocks on the first's
-- uncommitted row and then finds it.
CREATE TABLE consumer_inbox (
    consumer       text        NOT NULL,
    event_id       text        NOT NULL,
    kind           text        NOT NULL DEFAULT '',
    type           text        NOT NULL DEFAULT '',
    aggregate_type text        NOT NULL DEFAULT '',
    aggregate_id   text        NOT NULL DEFAULT '',
    revision       bigint      NOT NULL DEFAULT 0,
    -- held is transient (a revision gap inside the hold time); the others
    -- are what reconciliation reads.
    disposition    text        NOT NULL CHECK (disposition IN
                       ('held', 'applied', 'duplicate', 'parked_gap', 'parked_poison', 'rejected')),
    reason         text,
    -- Repeats of this event ID absorbed after its first delivery.
    duplicates     integer     NOT NULL DEFAULT 0 CHECK (duplicates >= 0),
    -- Kept while the event is held or parked so that it can be re-driven
    -- from here after the broker message was acknowledged; cleared once
    -- the event is applied.
    headers        jsonb,
    payload        bytea,
    held_since     timestamptz,
    received_at    timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Events waiting on their aggregate, in the order they will be re-driven.
CREATE INDEX consumer_inbox_waiting ON consumer_inbox (consumer, aggregate_type, aggregate_id, revision)
    WHERE disposition IN ('held', 'parked_gap', 'parked_poison');

CREATE INDEX consumer_inbox_disposition ON consumer_inbox (consumer, disposition);

-- Per (consumer, aggregate): the last applied revision and the park, for
-- consumers whose handler depends on the predecessor. The row is the lock
-- that serialises everything done to one aggregate by any instance.
CREATE TABLE consumer_positions (
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    last_revision  bigint      NOT NULL DEFAULT 0 CHECK (last_revision >= 0),
    parked         boolean     NOT NULL DEFAULT false,
    parked_reason  text,
    parked_at      timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);

CREATE INDEX consumer_positions_parked ON consumer_positions (consumer) WHERE parked;

-- +goose Down
DROP TABLE consumer_positions;
DROP TABLE consumer_inbox;
