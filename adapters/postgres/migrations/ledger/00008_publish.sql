-- +goose Up
-- Publishing from a team's own service: events and commands
-- written into the outbox inside the caller's own transaction, from Go (the
-- publish package) or from any language (posthorn_publish and
-- posthorn_send_command below), with every guarantee of the Posting API's
-- path.
--
-- Invariant the relay relies on: per aggregate, outbox id order is revision
-- order. The ledger keeps it with the account's row lock; here
-- posthorn_aggregates is that lock. Every writer takes the aggregate's row
-- (posthorn_next_revision) before it inserts the outbox row, in the same
-- transaction, so a second writer of the aggregate waits for the first to
-- commit or roll back, and its row (and id) comes after. Revisions are
-- gapless: the row holds the last revision written, and a caller's own
-- revision must be exactly the next one.
--
-- Aggregate types account and journal are the ledger's own (their
-- revisions live in its tables), so they are refused here.
CREATE TABLE posthorn_aggregates (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    revision       bigint NOT NULL CHECK (revision >= 1),
    PRIMARY KEY (aggregate_type, aggregate_id)
);

-- +goose StatementBegin
-- posthorn_uuidv7 is an RFC 9562 version 7 UUID (PostgreSQL 15 has none):
-- 48 bits of Unix milliseconds, then gen_random_uuid's random bits with the
-- version set to 7 (its variant bits are already RFC 4122's).
CREATE FUNCTION posthorn_uuidv7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn_shard is core.ShardOf: FNV-1a (32 bits) of the aggregate ID's
-- UTF-8 bytes, modulo the 16 shards. A test compares the two.
CREATE FUNCTION posthorn_shard(aggregate_id text) RETURNS int LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    b bytea := convert_to(aggregate_id, 'UTF8');
    h bigint := 2166136261;
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # get_byte(b, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN (h % 16)::int;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn_next_revision checks one message and takes its aggregate's row
-- lock (held to the end of the caller's transaction), and returns the
-- message's revision and topic. Every refusal raises SQLSTATE 22023 for a
-- field (the message starts with the field's name) or PH001 for a revision
-- that is not the next; either fails the caller's transaction.
CREATE FUNCTION posthorn_next_revision(kind text, aggregate_type text, aggregate_id text, type text,
        payload jsonb, headers jsonb, revision bigint, topic_prefix text)
    RETURNS TABLE (next_revision bigint, topic text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    k text;
    v jsonb;
    current bigint;
BEGIN
    IF aggregate_type IS NULL OR aggregate_type !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
            'aggregate_type: is %s, want 1 to 64 letters, digits, ''.'', ''_'' or ''-''', coalesce(quote_literal(left(aggregate_type, 80)), 'null'));
    END IF;
    IF aggregate_type IN ('account', 'journal') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
            'aggregate_type: %s is the ledger''s own (its revisions are kept by the Posting API)', quote_literal(aggregate_type));
    END IF;
    IF aggregate_id IS NULL OR length(aggregate_id) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'aggregate_id: want 1 to 256 characters';
    END IF;
    IF type IS NULL OR type !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
            'type: is %s, want 1 to 128 letters, digits, ''.'', ''_'' or ''-''', coalesce(quote_literal(left(type, 80)), 'null'));
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'payload: is required (a JSON document)';
    END IF;
    IF octet_length(payload::text) > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
            'payload: is %s bytes, want at most 1000000 (a Kafka record''s default limit)', octet_length(payload::text));
    END IF;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'headers: want a JSON object of strings';
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(headers) LOOP
        IF k !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
                'headers: key %s, want 1 to 64 letters, digits, ''.'', ''_'' or ''-''', quote_literal(left(k, 80)));
        END IF;
        IF k IN ('event_id', 'kind', 'type', 'aggregate_type', 'aggregate_id', 'revision', 'journal_id',
                 'occurred_at', 'replay', 'resend') THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('headers: key %s is a contract header', quote_literal(k));
        END IF;
        IF k = 'schema_version' AND v #>> '{}' !~ '^[1-9][0-9]{0,8}$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format(
                'headers: schema_version is %s, want a positive integer', v);
        END IF;
        IF jsonb_typeof(v) <> 'string' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('headers: %s is a JSON %s, want a string', quote_literal(k), jsonb_typeof(v));
        END IF;
    END LOOP;
    IF kind = 'command' AND (topic_prefix IS NULL OR topic_prefix !~ '^[A-Za-z0-9._-]{1,64}$') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'topic_prefix: want 1 to 64 letters, digits, ''.'', ''_'' or ''-''';
    END IF;
    IF revision IS NOT NULL AND revision < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('revision: is %s, want 1 or more (or none: the next)', revision);
    END IF;

    -- The lock: the aggregate's row, created on first use. A second writer
    -- of the aggregate waits here until this transaction ends.
    INSERT INTO posthorn_aggregates AS a (aggregate_type, aggregate_id, revision)
    VALUES (posthorn_next_revision.aggregate_type, posthorn_next_revision.aggregate_id, 1)
    ON CONFLICT ON CONSTRAINT posthorn_aggregates_pkey DO UPDATE SET revision = a.revision + 1
    RETURNING a.revision INTO current;
    IF revision IS NOT NULL AND revision <> current THEN
        RAISE EXCEPTION USING ERRCODE = 'PH001', MESSAGE = format(
            'revision: %s of %s %s is not the next: the next is %s (%s)', revision, aggregate_type, aggregate_id, current,
            CASE WHEN revision > current THEN 'a gap' ELSE 'a repeat' END);
    END IF;
    next_revision := current;
    IF kind = 'command' THEN
        topic := topic_prefix || split_part(type, '.', 1);
    ELSE
        topic := 'events.' || aggregate_type;
    END IF;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn_write writes one event or command (kind) into the outbox in
-- the caller's transaction, after its checks and its aggregate's lock
-- (posthorn_next_revision), and returns its event ID and revision.
CREATE FUNCTION posthorn_write(kind text, aggregate_type text, aggregate_id text, type text, payload jsonb,
        headers jsonb, expected_revision bigint, topic_prefix text)
    RETURNS TABLE (event_id uuid, revision bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    n record;
BEGIN
    SELECT * INTO n FROM posthorn_next_revision(kind, aggregate_type, aggregate_id, type, payload, headers, expected_revision, topic_prefix);
    event_id := posthorn_uuidv7();
    revision := n.next_revision;
    INSERT INTO outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, headers, payload, occurred_at)
    VALUES (event_id, kind, type, n.topic, aggregate_type, aggregate_id, revision, posthorn_shard(aggregate_id),
            headers, convert_to(payload::text, 'UTF8'), clock_timestamp());
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn_publish writes one event (contract.md); expected_revision, when
-- given, must be the aggregate's next revision.
CREATE FUNCTION posthorn_publish(aggregate_type text, aggregate_id text, type text, payload jsonb,
        headers jsonb DEFAULT '{}', expected_revision bigint DEFAULT NULL)
    RETURNS TABLE (event_id uuid, revision bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT * FROM posthorn_write('event', aggregate_type, aggregate_id, type, payload, headers, expected_revision, '')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn_send_command writes one command to <topic_prefix><service>
-- (the type's first segment, as the Posting API's commands), ordered
-- within its aggregate.
CREATE FUNCTION posthorn_send_command(aggregate_type text, aggregate_id text, type text, payload jsonb,
        headers jsonb DEFAULT '{}', expected_revision bigint DEFAULT NULL, topic_prefix text DEFAULT 'commands.')
    RETURNS TABLE (event_id uuid, revision bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT * FROM posthorn_write('command', aggregate_type, aggregate_id, type, payload, headers, expected_revision, topic_prefix)
$$;
-- +goose StatementEnd

-- Functions are executable by PUBLIC by default; only the roles granted in
-- roles/ledger.sql may call these.
REVOKE ALL ON FUNCTION posthorn_next_revision(text, text, text, text, jsonb, jsonb, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION posthorn_write(text, text, text, text, jsonb, jsonb, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION posthorn_publish(text, text, text, jsonb, jsonb, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text);
DROP FUNCTION posthorn_publish(text, text, text, jsonb, jsonb, bigint);
DROP FUNCTION posthorn_write(text, text, text, text, jsonb, jsonb, bigint, text);
DROP FUNCTION posthorn_next_revision(text, text, text, text, jsonb, jsonb, bigint, text);
DROP FUNCTION posthorn_shard(text);
DROP FUNCTION posthorn_uuidv7();
DROP TABLE posthorn_aggregates;
