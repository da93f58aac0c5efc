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

-- The CDC relay's default publication (relay.cdc.publication): inserts into
-- the outbox only. Created here, by the schema's owner, so the relay's role
-- needs no ownership of the outbox; a relay configured with another name
-- creates that one itself (which does need ownership). On a server with
-- wal_level below logical this only warns.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'posthorn_outbox') THEN
        CREATE PUBLICATION posthorn_outbox FOR TABLE outbox WITH (publish = 'insert');
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP PUBLICATION IF EXISTS posthorn_outbox;
DROP TABLE relay_cdc_leases;
