-- +goose Up
-- A way out for a record the sink can never take, and a write-time refusal
-- of what the configured sink can never carry.
--
-- dead_letters keeps every record an operator dead-lettered, whole (kind,
-- type, topic, aggregate, revision, headers, payload), with why (the relay's
-- park reason), who and when. The record leaves the wire, not the ledger
-- database: it is read back from here.
--
-- posthorn.dead_letter moves a parked record there and, in the same
-- transaction, rewrites its outbox row into a skip marker (type
-- posthorn.dead_lettered, same event ID and revision, a small payload naming
-- what was skipped) and lifts the park. The relay then sends the marker in
-- the record's place and the aggregate's later events after it: an ordered
-- consumer receives revision last+1 as it expects and records it as
-- skipped, so the gap is explicit and named, never silence. It is the only
-- way a component rewrites an outbox row, and it rewrites only the record
-- the relay parked, only while it is unrelayed.
--
-- posthorn.settings.max_record_bytes is the largest record the configured
-- sink carries (posthorn migrate writes it from sink.kind and its keys);
-- posthorn.write refuses a payload whose record would exceed it, naming the
-- field and the limit, before anything is written.
ALTER TABLE posthorn.settings ADD COLUMN max_record_bytes bigint NOT NULL DEFAULT 1000000
    CONSTRAINT max_record_bytes_floor CHECK (max_record_bytes >= 4096);

CREATE TABLE dead_letters (
    event_id          uuid        PRIMARY KEY,
    outbox_id         bigint      NOT NULL,
    kind              text        NOT NULL,
    type              text        NOT NULL,
    topic             text        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    revision          bigint      NOT NULL,
    headers           jsonb       NOT NULL,
    payload           bytea       NOT NULL,
    reason            text        NOT NULL,
    operator          text        NOT NULL,
    dead_lettered_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose StatementBegin
-- posthorn.dead_letter dead-letters the record parked for the aggregate:
-- event_id, when given, must be the parked one. It refuses (SQLSTATE 22023,
-- the message starting with the field) an aggregate that is not parked, an
-- event ID that is not the parked one, a record already relayed, and an
-- empty operator. It returns the dead-lettered event ID and revision. With
-- audit it also appends the decision to console_audit (the console, which
-- audits its actions itself, passes false).
CREATE FUNCTION posthorn.dead_letter(aggregate_type text, aggregate_id text, event_id uuid, operator text,
        remote_addr text, audit boolean)
    RETURNS TABLE (dead_event_id uuid, dead_revision bigint, dead_topic text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parked public.relay_parked%ROWTYPE;
    o public.outbox%ROWTYPE;
BEGIN
    IF operator IS NULL OR pg_catalog.btrim(operator) = '' OR pg_catalog.length(operator) > 64 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'operator: want 1 to 64 characters (who decided, for the audit log)';
    END IF;
    SELECT p.* INTO parked FROM public.relay_parked AS p
     WHERE p.aggregate_type = dead_letter.aggregate_type AND p.aggregate_id = dead_letter.aggregate_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'aggregate_id: %s %s is not parked on the relay (only a parked record can be dead-lettered)',
            pg_catalog.quote_literal(pg_catalog.left(aggregate_type, 80)), pg_catalog.quote_literal(pg_catalog.left(aggregate_id, 80)));
    END IF;
    IF event_id IS NOT NULL AND event_id <> parked.event_id THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'event_id: %s is not the parked record of %s %s, which is %s', event_id,
            pg_catalog.quote_literal(aggregate_type), pg_catalog.quote_literal(aggregate_id), parked.event_id);
    END IF;
    SELECT x.* INTO o FROM public.outbox AS x WHERE x.event_id = parked.event_id FOR UPDATE;
    IF NOT FOUND OR NOT EXISTS (SELECT 1 FROM public.outbox_pending AS q WHERE q.shard = o.shard AND q.id = o.id) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'event_id: the parked record %s is no unrelayed outbox row (relayed or cleaned up meanwhile): release the aggregate instead',
            parked.event_id);
    END IF;
    INSERT INTO public.dead_letters (event_id, outbox_id, kind, type, topic, aggregate_type, aggregate_id, revision,
                                     headers, payload, reason, operator)
    VALUES (o.event_id, o.id, o.kind, o.type, o.topic, o.aggregate_type, o.aggregate_id, o.revision,
            o.headers, o.payload, parked.reason, dead_letter.operator);
    UPDATE public.outbox AS x SET type = 'posthorn.dead_lettered',
        headers = pg_catalog.jsonb_build_object('dead_lettered_type', o.type),
        payload = pg_catalog.convert_to(pg_catalog.jsonb_build_object(
            'dead_lettered_type', o.type, 'payload_bytes', pg_catalog.octet_length(o.payload),
            'reason', pg_catalog.left(parked.reason, 500), 'dead_letter_table', 'dead_letters')::text, 'UTF8')
     WHERE x.id = o.id;
    DELETE FROM public.relay_parked AS p
     WHERE p.aggregate_type = dead_letter.aggregate_type AND p.aggregate_id = dead_letter.aggregate_id;
    IF audit THEN
        INSERT INTO public.console_audit (operator, remote_addr, action, target, outcome, detail, finished_at)
        VALUES (dead_letter.operator, coalesce(remote_addr, ''), 'dead-letter',
                aggregate_type || ' ' || aggregate_id || ' event ' || o.event_id::text, 'ok',
                pg_catalog.format('revision %s moved to dead_letters; a skip marker takes its place', o.revision), pg_catalog.now());
    END IF;
    dead_event_id := o.event_id;
    dead_revision := o.revision;
    dead_topic := o.topic;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION posthorn.dead_letter(text, text, uuid, text, text, boolean) FROM PUBLIC;

-- +goose StatementBegin
-- posthorn.write as in 00009, with the payload limit read from
-- posthorn.settings.max_record_bytes instead of a constant: the payload and
-- its headers, with 4096 bytes kept for the envelope (the contract's
-- headers and the record key), must fit in one record of the sink.
CREATE OR REPLACE FUNCTION posthorn.write(kind text, aggregate_type text, aggregate_id text, type text, payload json,
        headers jsonb DEFAULT '{}', expected_revision bigint DEFAULT NULL, topic_prefix text DEFAULT NULL)
    RETURNS TABLE (event_id uuid, revision bigint, topic text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k text;
    v jsonb;
    current bigint;
    configured text;
    body text := payload::text;
    max_record bigint;
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
    IF headers IS NULL OR pg_catalog.jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'headers: want a JSON object of strings';
    END IF;
    SELECT s.max_record_bytes INTO max_record FROM posthorn.settings AS s;
    IF pg_catalog.octet_length(body) + pg_catalog.octet_length(headers::text) + 4096 > max_record THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'payload: is %s bytes (headers %s), want at most %s with its headers: the configured sink takes records of at most %s bytes (posthorn.settings.max_record_bytes, written by posthorn migrate from sink.*), 4096 of them kept for the envelope',
            pg_catalog.octet_length(body), pg_catalog.octet_length(headers::text), max_record - 4096, max_record);
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

-- +goose Down
-- The setting stays: posthorn.write reads it.
DROP FUNCTION posthorn.dead_letter(text, text, uuid, text, text, boolean);
DROP TABLE dead_letters;
