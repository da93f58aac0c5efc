-- +goose Up
-- A ledger failover no longer loses what a posting's idempotency key
-- answers, and a posting it re-commits carries nothing the relay cannot
-- send.
--
-- Every ledger event carries its posting's idempotency digest (header
-- idempotency_digest: the SHA-256 of the key and the request's hash, never
-- the key). posthorn failover recover reads it back from what the world
-- saw and records it here: for a posting it re-committed (restored), a
-- retry of the key answers that journal and writes nothing; for one it
-- could not re-commit (lost), the retry is refused with the journal's ID
-- instead of moving the money a second time. The Posting API looks the
-- digest up in the first round trip of every posting; the table is empty
-- but after a recovery. A row counts until expires_at, the key's own
-- lifetime (posthorn.settings.idempotency_key_ttl from the posting's
-- time), the same horizon after which a retry is a new posting anyway.
CREATE TABLE posthorn.failover_keys (
    digest      text        PRIMARY KEY CHECK (digest ~ '^[A-Za-z0-9_-]{43}$'),
    journal_id  uuid        NOT NULL,
    restored    boolean     NOT NULL,
    reason      text        NOT NULL DEFAULT '' CHECK (restored OR reason <> ''),
    expires_at  timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- +goose StatementBegin
-- posthorn.failover_rebuild is posthorn.failover_recommit (same arguments
-- and result) with two more rules, and the recovery calls it instead:
--   - every line's headers are ones the write path could have stored: a
--     key of 1 to 64 letters, digits, '.', '_' or '-' starting with a
--     letter or digit (posthorn.write's rule: it refuses Watermill's
--     reserved _watermill_message_uuid, which Kafka and Redis sinks refuse
--     for good), none of the contract's headers (they have columns), string
--     values. A header read back from a sink that a transport added is
--     refused here, naming it, instead of parking the account when the
--     relay sends the row;
--   - the transaction carries the logical decoding message
--     posthorn.relayed, before its outbox rows: a CDC relay that streams
--     the transaction checks its rows' markers and skips those inserted as
--     relayed, rather than sending them as new records.
CREATE FUNCTION posthorn.failover_rebuild(journal_id uuid, posted_at timestamptz, lines jsonb)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    i int;
    k text;
    v jsonb;
BEGIN
    IF lines IS NOT NULL AND pg_catalog.jsonb_typeof(lines) = 'array' THEN
        FOR i IN 0 .. pg_catalog.jsonb_array_length(lines) - 1 LOOP
            CONTINUE WHEN pg_catalog.jsonb_typeof(lines->i->'headers') IS DISTINCT FROM 'object';
            FOR k, v IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(lines->i->'headers') AS e LOOP
                IF k !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN
                    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                        'lines[%s].headers: key %s, want 1 to 64 letters, digits, ''.'', ''_'' or ''-'' starting with a letter or digit (a header a transport added is not the event''s)',
                        i, pg_catalog.quote_literal(pg_catalog.left(k, 80)));
                END IF;
                IF k IN ('event_id', 'kind', 'type', 'aggregate_type', 'aggregate_id', 'revision', 'journal_id',
                         'occurred_at', 'replay', 'resend', 'ledger_timeline', 'schema_version', 'content_type') THEN
                    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                        'lines[%s].headers: key %s is a contract header', i, pg_catalog.quote_literal(k));
                END IF;
                IF pg_catalog.jsonb_typeof(v) <> 'string' THEN
                    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                        'lines[%s].headers: %s is a JSON %s, want a string', i, pg_catalog.quote_literal(k), pg_catalog.jsonb_typeof(v));
                END IF;
            END LOOP;
        END LOOP;
    END IF;
    PERFORM pg_catalog.pg_logical_emit_message(true, 'posthorn.relayed', '');
    RETURN posthorn.failover_recommit(journal_id, posted_at, lines);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.failover_record_key records the idempotency digest of a lost
-- posting: restored when the recovery re-committed it as journal_id,
-- otherwise lost, with the reason. It keeps the first record of a digest
-- and returns whether this one was new. The row counts until the key's
-- lifetime (posthorn.settings) from posted_at, the posting's time.
CREATE FUNCTION posthorn.failover_record_key(digest text, journal_id uuid, restored boolean, reason text,
        posted_at timestamptz)
    RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n int;
BEGIN
    IF digest IS NULL OR digest !~ '^[A-Za-z0-9_-]{43}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'digest: is %s, want 43 base64url characters', coalesce(pg_catalog.quote_literal(pg_catalog.left(digest, 80)), 'null'));
    END IF;
    IF journal_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'journal_id: is required';
    END IF;
    IF restored IS NULL OR (NOT restored AND coalesce(reason, '') = '') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'reason: is required for a key that was not restored';
    END IF;
    IF posted_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'posted_at: is required';
    END IF;
    INSERT INTO posthorn.failover_keys (digest, journal_id, restored, reason, expires_at)
    SELECT failover_record_key.digest, failover_record_key.journal_id, failover_record_key.restored,
           coalesce(failover_record_key.reason, ''), failover_record_key.posted_at + s.idempotency_key_ttl
    FROM posthorn.settings AS s
    ON CONFLICT ON CONSTRAINT failover_keys_pkey DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END
$$;
-- +goose StatementEnd

REVOKE ALL ON TABLE posthorn.failover_keys FROM PUBLIC;
REVOKE ALL ON FUNCTION posthorn.failover_rebuild(uuid, timestamptz, jsonb),
    posthorn.failover_record_key(text, uuid, boolean, text, timestamptz) FROM PUBLIC;

-- +goose Down
DROP FUNCTION posthorn.failover_record_key(text, uuid, boolean, text, timestamptz);
DROP FUNCTION posthorn.failover_rebuild(uuid, timestamptz, jsonb);
DROP TABLE posthorn.failover_keys;
