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

-- No trigger wakes the relay: a NOTIFY inside the posting transaction takes
-- PostgreSQL's database-wide notify lock at commit and holds it through the
-- commit's WAL flush, which serialised every posting (measured: -67% ledger
-- tx/s with 8 writers). LedgerStore notifies after commit instead, coalesced,
-- from outside the posting transaction (see LedgerStore.wake).

-- +goose Down
DROP TABLE relay_parked;
DROP TABLE relay_members;
DROP TABLE relay_leases;
DROP SEQUENCE relay_fencing_token;
