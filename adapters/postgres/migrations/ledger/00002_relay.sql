-- +goose Up
-- The relay's tables: shard leases with fencing tokens, the live relays
-- (to share shards evenly), parked aggregates, and the wake-up trigger.

-- Fencing tokens: every lease grant takes a new, larger value, so a marker
-- written under an older grant can be told apart and refused.
CREATE SEQUENCE relay_fencing_token AS bigint;

-- One row per outbox shard (core.Shards = 16; changing it needs a migration
-- that drains the outbox first). owner NULL means free; a lease whose
-- expires_at has passed may be taken by any relay.
CREATE TABLE relay_leases (
    shard      int         PRIMARY KEY CHECK (shard >= 0),
    owner      text,
    token      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO relay_leases (shard) SELECT generate_series(0, 15);

-- Relays that heartbeat here count as live when shares are computed.
CREATE TABLE relay_members (
    owner   text        PRIMARY KEY,
    seen_at timestamptz NOT NULL DEFAULT now()
);

-- An aggregate whose record the sink rejected for good. The relay reads none
-- of its rows until an operator releases it (posthorn outbox release), so
-- its order is kept and every other aggregate keeps flowing.
CREATE TABLE relay_parked (
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_id       uuid        NOT NULL,
    reason         text        NOT NULL,
    parked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- Wake the relay when rows arrive: one notification per shard per statement
-- (Postgres folds equal notifications of one transaction and delivers them
-- at commit, so a rolled-back insert wakes nobody).
-- +goose StatementBegin
CREATE FUNCTION posthorn_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('posthorn_outbox', s.shard::text)
    FROM (SELECT DISTINCT shard FROM new_rows) AS s;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION posthorn_outbox_notify();

-- +goose Down
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION posthorn_outbox_notify();
DROP TABLE relay_parked;
DROP TABLE relay_members;
DROP TABLE relay_leases;
DROP SEQUENCE relay_fencing_token;
