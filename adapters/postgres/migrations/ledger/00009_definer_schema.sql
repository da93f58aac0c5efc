-- +goose Up
-- The publishing functions move into a schema of their own and stop
-- trusting anything a caller can create.
--
-- Why: a SECURITY DEFINER function runs with its owner's rights, and every
-- unqualified name in it is looked up along its search_path. With
-- search_path = public, pg_temp, a caller who may CREATE in public
-- (PostgreSQL 14's default, and any cluster upgraded from it) could define
-- public.convert_to(text, text), an exact match that beats pg_catalog's
-- convert_to(text, name), and have it run as the owner inside
-- posthorn_publish. Here:
--   - the definer functions live in the schema posthorn, which no caller
--     may create in;
--   - their search_path is pg_catalog, pg_temp, so operators and types
--     resolve in pg_catalog only, and every function call and table is
--     schema-qualified as well;
--   - posthorn migrate --roles hands them to posthorn_definer, a NOLOGIN
--     role that is no superuser and holds only what they need
--     (roles/ledger.sql), so even a hijack would gain little.
-- The contract's names posthorn_publish and posthorn_send_command stay in
-- public as thin wrappers that run with the caller's rights.
--
-- The command topic prefix and the idempotency keys' lifetime are the
-- configuration's (sink.command_topic_prefix,
-- retention.idempotency_key_ttl): posthorn migrate writes them into
-- posthorn.settings, and the functions read them there rather than take
-- them from the caller.
CREATE SCHEMA posthorn;

CREATE TABLE posthorn.settings (
    singleton            boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    command_topic_prefix text     NOT NULL DEFAULT 'commands.'
        CONSTRAINT command_topic_prefix_shape CHECK (command_topic_prefix ~ '^[A-Za-z0-9._-]{1,64}$')
        CONSTRAINT command_topic_prefix_unreserved CHECK (lower(command_topic_prefix) !~ '^(ledger|events|outbox)[._-]'),
    idempotency_key_ttl  interval NOT NULL DEFAULT '720 hours'
        CONSTRAINT idempotency_key_ttl_floor CHECK (idempotency_key_ttl >= interval '1 hour')
);
INSERT INTO posthorn.settings DEFAULT VALUES;

-- +goose StatementBegin
-- posthorn.uuidv7 is an RFC 9562 version 7 UUID (PostgreSQL 15 has none):
-- 48 bits of Unix milliseconds, then gen_random_uuid's random bits with the
-- version set to 7 (its variant bits are already RFC 4122's).
CREATE FUNCTION posthorn.uuidv7() RETURNS uuid LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.encode(pg_catalog.set_bit(pg_catalog.set_bit(pg_catalog.overlay(
        pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
        pg_catalog.substr(pg_catalog.int8send((pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint), 3),
        1, 6), 52, 1), 53, 1), 'hex')::uuid
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.shard is core.ShardOf: FNV-1a (32 bits) of the aggregate ID's
-- UTF-8 bytes, modulo the 16 shards. A test compares the two.
CREATE FUNCTION posthorn.shard(aggregate_id text) RETURNS int LANGUAGE plpgsql IMMUTABLE STRICT
    SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b bytea := pg_catalog.convert_to(aggregate_id, 'UTF8');
    h bigint := 2166136261;
BEGIN
    FOR i IN 0 .. pg_catalog.length(b) - 1 LOOP
        h := ((h # pg_catalog.get_byte(b, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN (h % 16)::int;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.write checks one event or command (kind), takes its aggregate's
-- row lock (held to the end of the caller's transaction), writes the
-- outbox row and returns its event ID, revision and topic. The payload is
-- json, not jsonb, so the caller's bytes are stored as given.
--
-- Per aggregate, outbox id order is revision order: every writer takes the
-- aggregate's row in posthorn_aggregates before it inserts, so a second
-- writer of the aggregate waits for the first to commit or roll back.
-- Revisions are gapless; a caller's own revision must be the next one.
-- Aggregate types account and journal are the ledger's own (their
-- revisions live in its tables).
--
-- Commands go to the configured prefix (posthorn.settings) and the type's
-- first segment. topic_prefix exists for callers of the old signature: it
-- may only repeat the configured prefix, so no caller can put a command on
-- the ledger's or an events topic.
--
-- Every refusal raises SQLSTATE 22023 for a field (the message starts with
-- the field's name) or PH001 for a revision that is not the next; either
-- fails the caller's transaction.
CREATE FUNCTION posthorn.write(kind text, aggregate_type text, aggregate_id text, type text, payload json,
        headers jsonb DEFAULT '{}', expected_revision bigint DEFAULT NULL, topic_prefix text DEFAULT NULL)
    RETURNS TABLE (event_id uuid, revision bigint, topic text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k text;
    v jsonb;
    current bigint;
    configured text;
    body text := payload::text;
BEGIN
    IF kind IS NULL OR kind NOT IN ('event', 'command') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'kind: want event or command';
    END IF;
    IF aggregate_type IS NULL OR aggregate_type !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'aggregate_type: is %s, want 1 to 64 letters, digits, ''.'', ''_'' or ''-''',
            coalesce(pg_catalog.quote_literal(pg_catalog.left(aggregate_type, 80)), 'null'));
    END IF;
    IF aggregate_type IN ('account', 'journal') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'aggregate_type: %s is the ledger''s own (its revisions are kept by the Posting API)', pg_catalog.quote_literal(aggregate_type));
    END IF;
    IF aggregate_id IS NULL OR pg_catalog.length(aggregate_id) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'aggregate_id: want 1 to 256 characters';
    END IF;
    IF type IS NULL OR type !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'type: is %s, want 1 to 128 letters, digits, ''.'', ''_'' or ''-''',
            coalesce(pg_catalog.quote_literal(pg_catalog.left(type, 80)), 'null'));
    END IF;
    IF body IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'payload: is required (a JSON document)';
    END IF;
    IF pg_catalog.octet_length(body) > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'payload: is %s bytes, want at most 1000000 (a Kafka record''s default limit)', pg_catalog.octet_length(body));
    END IF;
    IF headers IS NULL OR pg_catalog.jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'headers: want a JSON object of strings';
    END IF;
    FOR k, v IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(headers) AS e LOOP
        IF k !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                'headers: key %s, want 1 to 64 letters, digits, ''.'', ''_'' or ''-''', pg_catalog.quote_literal(pg_catalog.left(k, 80)));
        END IF;
        IF k IN ('event_id', 'kind', 'type', 'aggregate_type', 'aggregate_id', 'revision', 'journal_id',
                 'occurred_at', 'replay', 'resend') THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format('headers: key %s is a contract header', pg_catalog.quote_literal(k));
        END IF;
        IF k = 'schema_version' AND v #>> '{}' !~ '^[1-9][0-9]{0,8}$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                'headers: schema_version is %s, want a positive integer', v);
        END IF;
        IF pg_catalog.jsonb_typeof(v) <> 'string' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                'headers: %s is a JSON %s, want a string', pg_catalog.quote_literal(k), pg_catalog.jsonb_typeof(v));
        END IF;
    END LOOP;
    IF expected_revision IS NOT NULL AND expected_revision < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format('revision: is %s, want 1 or more (or none: the next)', expected_revision);
    END IF;
    IF kind = 'command' THEN
        SELECT s.command_topic_prefix INTO configured FROM posthorn.settings AS s;
        IF topic_prefix IS NOT NULL AND pg_catalog.lower(topic_prefix) ~ '^(ledger|events|outbox)[._-]' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                'topic_prefix: %s is reserved (ledger.*, events.* and outbox.* are the ledger''s and the events'' topics); commands go to the configured %s: omit topic_prefix',
                pg_catalog.quote_literal(pg_catalog.left(topic_prefix, 80)), pg_catalog.quote_literal(configured));
        END IF;
        IF topic_prefix IS NOT NULL AND topic_prefix <> configured THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                'topic_prefix: is %s, but commands go to the configured %s (sink.command_topic_prefix, written by posthorn migrate): omit topic_prefix',
                pg_catalog.quote_literal(pg_catalog.left(topic_prefix, 80)), pg_catalog.quote_literal(configured));
        END IF;
        topic := configured || pg_catalog.split_part(type, '.', 1);
    ELSE
        topic := 'events.' || aggregate_type;
    END IF;

    -- The lock: the aggregate's row, created on first use. A second writer
    -- of the aggregate waits here until this transaction ends.
    INSERT INTO public.posthorn_aggregates AS a (aggregate_type, aggregate_id, revision)
    VALUES (write.aggregate_type, write.aggregate_id, 1)
    ON CONFLICT ON CONSTRAINT posthorn_aggregates_pkey DO UPDATE SET revision = a.revision + 1
    RETURNING a.revision INTO current;
    IF expected_revision IS NOT NULL AND expected_revision <> current THEN
        RAISE EXCEPTION USING ERRCODE = 'PH001', MESSAGE = pg_catalog.format(
            'revision: %s of %s %s is not the next: the next is %s (%s)', expected_revision, aggregate_type, aggregate_id, current,
            CASE WHEN expected_revision > current THEN 'a gap' ELSE 'a repeat' END);
    END IF;
    event_id := posthorn.uuidv7();
    revision := current;
    INSERT INTO public.outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, headers, payload, occurred_at)
    VALUES (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, posthorn.shard(aggregate_id),
            headers, pg_catalog.convert_to(body, 'UTF8'), pg_catalog.clock_timestamp());
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.prune_idempotency_keys deletes at most batch of the Posting
-- API's idempotency keys, oldest first, among those created before before
-- and older than the configured lifetime (posthorn.settings), and returns
-- how many it deleted. It is the only way a component deletes keys: a
-- caller cannot make a live key expire, so a client's retry within the
-- lifetime never becomes a second posting.
CREATE FUNCTION posthorn.prune_idempotency_keys(before timestamptz, batch integer) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    horizon timestamptz;
    n bigint;
BEGIN
    IF batch IS NULL OR batch < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'batch: want 1 or more';
    END IF;
    SELECT pg_catalog.now() - s.idempotency_key_ttl INTO horizon FROM posthorn.settings AS s;
    IF before IS NOT NULL AND before < horizon THEN
        horizon := before;
    END IF;
    DELETE FROM public.idempotency_keys WHERE key IN (
        SELECT i.key FROM public.idempotency_keys AS i WHERE i.created_at < horizon ORDER BY i.created_at LIMIT batch);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- The trigger that enqueues each outbox row now also runs inside
-- posthorn.write, under its search_path: it names its table in full.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_enqueue() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO public.outbox_pending (shard, id) SELECT e.shard, e.id FROM enqueued AS e;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- The old definer functions trusted public; they go. The contract's two
-- names stay, as wrappers that run with the caller's rights and need
-- EXECUTE on posthorn.write (roles/ledger.sql).
DROP FUNCTION posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text);
DROP FUNCTION posthorn_publish(text, text, text, jsonb, jsonb, bigint);
DROP FUNCTION posthorn_write(text, text, text, text, jsonb, jsonb, bigint, text);
DROP FUNCTION posthorn_next_revision(text, text, text, text, jsonb, jsonb, bigint, text);
DROP FUNCTION posthorn_shard(text);
DROP FUNCTION posthorn_uuidv7();

-- +goose StatementBegin
-- posthorn_publish writes one event (contract.md); expected_revision, when
-- given, must be the aggregate's next revision.
CREATE FUNCTION public.posthorn_publish(aggregate_type text, aggregate_id text, type text, payload jsonb,
        headers jsonb DEFAULT '{}', expected_revision bigint DEFAULT NULL)
    RETURNS TABLE (event_id uuid, revision bigint)
    LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT w.event_id, w.revision FROM posthorn.write('event', aggregate_type, aggregate_id, type, payload::json, headers, expected_revision) AS w
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn_send_command writes one command to the configured command topic
-- of its service (the type's first segment), ordered within its
-- aggregate. topic_prefix, when given, must be the configured prefix.
CREATE FUNCTION public.posthorn_send_command(aggregate_type text, aggregate_id text, type text, payload jsonb,
        headers jsonb DEFAULT '{}', expected_revision bigint DEFAULT NULL, topic_prefix text DEFAULT NULL)
    RETURNS TABLE (event_id uuid, revision bigint)
    LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT w.event_id, w.revision FROM posthorn.write('command', aggregate_type, aggregate_id, type, payload::json, headers, expected_revision, topic_prefix) AS w
$$;
-- +goose StatementEnd

-- Functions are executable by PUBLIC by default; only the roles granted in
-- roles/ledger.sql may call these.
REVOKE ALL ON FUNCTION posthorn.uuidv7(), posthorn.shard(text),
    posthorn.write(text, text, text, text, json, jsonb, bigint, text),
    posthorn.prune_idempotency_keys(timestamptz, integer),
    public.posthorn_publish(text, text, text, jsonb, jsonb, bigint),
    public.posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION public.posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text);
DROP FUNCTION public.posthorn_publish(text, text, text, jsonb, jsonb, bigint);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_pending (shard, id) SELECT shard, id FROM enqueued;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
DROP SCHEMA posthorn CASCADE;
-- The functions of 00008_publish.sql, as they were.
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

