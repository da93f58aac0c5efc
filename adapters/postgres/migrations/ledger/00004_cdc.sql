-- +goose Up
-- The CDC relay's lease: one reader per replication slot. A relay that holds
-- the row (owner, unexpired) is the only one streaming the slot; each grant
-- takes a new fencing token from the shard leases' sequence, and markers
-- written by the CDC relay are fenced on it (relay_token), so a stalled
-- reader whose lease was taken over cannot mark rows any more.
CREATE TABLE relay_cdc_leases (
    slot            text        PRIMARY KEY,
    owner           text,
    token           bigint      NOT NULL DEFAULT 0,
    expires_at      timestamptz NOT NULL DEFAULT '-infinity',
    -- When the relay last created the slot (NULL: never). A slot that is
    -- missing although this is set was dropped or lost: the relay says so
    -- loudly and recovers through the outbox.
    slot_created_at timestamptz,
    -- The slot's consistent point at creation, for the operator's eyes.
    slot_created_lsn pg_lsn
);

-- +goose Down
DROP TABLE relay_cdc_leases;
