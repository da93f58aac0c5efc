-- +goose Up
-- A publish no longer writes a new version of its aggregate's row.
--
-- posthorn.write took its aggregate's lock by bumping posthorn_aggregates'
-- revision (INSERT ... ON CONFLICT DO UPDATE): a new version of the row per
-- event. While a long snapshot holds the horizon none of them can be
-- pruned, and every later publish of the aggregate walks them all to find
-- the live one: measured under a held REPEATABLE READ snapshot, the bump
-- alone read 12 buffers at first, 66, 120 and 174 after 10,000, 20,000 and
-- 30,000 events of one aggregate (docs/measured.md has the benchmark). Now
-- it only locks the row (SELECT ... FOR UPDATE writes no version) and
-- reads the newest revision from the outbox's unique index
-- (aggregate_type, aggregate_id, revision), whose newest entry is the
-- first one a backward scan meets: a flat 3 and 4 buffers. The outbox rows are inserted, never updated, so
-- no dead versions pile up in front of that entry.
--
-- posthorn_aggregates.revision becomes a floor: every revision written is
-- in the outbox or at most the floor, so the newest is the greater of the
-- floor and the outbox's highest. Cleanup deletes relayed outbox rows,
-- sometimes an aggregate's newest: the trigger below raises the floor to
-- the highest revision each delete removes, in the deleting statement's
-- transaction, so a revision is never handed out twice. A new aggregate's
-- row starts at 1, its first revision. failover_advance raises the floor
-- as before and counts an aggregate as moved only if its newest revision
-- was below the one it sets.
--
-- The same for the ledger's accounts: a posting bumped accounts.revision,
-- a version per posting of each of its accounts. It now locks the rows as
-- before and reads each account's newest revision from journal_lines'
-- unique index (account_id, revision); journal lines are never updated or
-- deleted. accounts.revision is a floor that only failover_advance raises
-- (revisions a lost primary gave out), and account_revisions is what every
-- reader of an account's revision reads: the greater of the two.
-- (account_balances is still updated per posting.)

-- An account's revision: the newest of its journal lines, or the floor a
-- failover recovery raised it to if that is greater.
CREATE VIEW account_revisions AS
SELECT a.id, GREATEST(a.revision, coalesce((SELECT l.revision FROM journal_lines AS l WHERE l.account_id = a.id
                                            ORDER BY l.revision DESC LIMIT 1), 0)) AS revision
FROM accounts AS a;

-- +goose StatementBegin
CREATE FUNCTION posthorn.raise_revision_floor() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE public.posthorn_aggregates AS a SET revision = d.revision
    FROM (SELECT g.aggregate_type, g.aggregate_id, pg_catalog.max(g.revision) AS revision
          FROM gone AS g GROUP BY g.aggregate_type, g.aggregate_id) AS d
    WHERE a.aggregate_type = d.aggregate_type AND a.aggregate_id = d.aggregate_id AND a.revision < d.revision;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION posthorn.raise_revision_floor() FROM PUBLIC;

CREATE TRIGGER outbox_revision_floor AFTER DELETE ON outbox
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION posthorn.raise_revision_floor();

-- +goose StatementBegin
-- posthorn.write as in 00013, its lock without a new version.
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
    lowest bigint;
    newest bigint;
    inserted bigint;
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

    -- The lock: the aggregate's row, created on first use (then this is
    -- revision 1). A second writer of the aggregate waits here until this
    -- transaction ends. Locking writes no new version of the row.
    INSERT INTO public.posthorn_aggregates AS a (aggregate_type, aggregate_id, revision)
    VALUES (write.aggregate_type, write.aggregate_id, 1)
    ON CONFLICT ON CONSTRAINT posthorn_aggregates_pkey DO NOTHING
    RETURNING a.revision INTO current;
    IF current IS NULL THEN
        SELECT a.revision INTO STRICT lowest FROM public.posthorn_aggregates AS a
        WHERE a.aggregate_type = write.aggregate_type AND a.aggregate_id = write.aggregate_id
        FOR UPDATE;
        -- Read after the lock: at READ COMMITTED this statement's snapshot
        -- holds every revision committed before the lock was granted.
        -- ORDER BY ... LIMIT 1, not max(): the planner, thinking a young
        -- table small, aggregated every entry of the aggregate instead.
        SELECT o.revision INTO newest FROM public.outbox AS o
        WHERE o.aggregate_type = write.aggregate_type AND o.aggregate_id = write.aggregate_id
        ORDER BY o.revision DESC LIMIT 1;
        current := GREATEST(lowest, coalesce(newest, 0)) + 1;
    END IF;
    IF expected_revision IS NOT NULL AND expected_revision <> current THEN
        RAISE EXCEPTION USING ERRCODE = 'PH001', MESSAGE = pg_catalog.format(
            'revision: %s of %s %s is not the next: the next is %s (%s)', expected_revision, aggregate_type, aggregate_id, current,
            CASE WHEN expected_revision > current THEN 'a gap' ELSE 'a repeat' END);
    END IF;
    event_id := posthorn.uuidv7();
    revision := current;
    -- A caller at REPEATABLE READ or SERIALIZABLE does not see a revision
    -- committed after its snapshot: its insert then meets that row, which
    -- ON CONFLICT reports as a serialization failure (40001, retry) instead
    -- of a unique violation. At READ COMMITTED it cannot meet one.
    INSERT INTO public.outbox AS o (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, headers, payload, occurred_at)
    VALUES (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, posthorn.shard(aggregate_id),
            headers, pg_catalog.convert_to(body, 'UTF8'), pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT outbox_aggregate_type_aggregate_id_revision_key DO NOTHING
    RETURNING o.revision INTO inserted;
    IF inserted IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = pg_catalog.format(
            'revision %s of %s %s was written by a concurrent transaction: retry', revision, aggregate_type, aggregate_id);
    END IF;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.failover_advance as in 00012, counting only true moves.
CREATE OR REPLACE FUNCTION posthorn.failover_advance(outbox_id bigint, journal_sequence bigint,
        aggregate_types text[], aggregate_ids text[], revisions bigint[],
        OUT sequences_moved int, OUT aggregates_moved int)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cur bigint;
    n int;
BEGIN
    IF outbox_id IS NULL OR outbox_id < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'outbox_id: want 0 or more';
    END IF;
    IF journal_sequence IS NULL OR journal_sequence < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'journal_sequence: want 0 or more';
    END IF;
    IF aggregate_types IS NULL OR aggregate_ids IS NULL OR revisions IS NULL
       OR pg_catalog.cardinality(aggregate_types) <> pg_catalog.cardinality(aggregate_ids)
       OR pg_catalog.cardinality(aggregate_types) <> pg_catalog.cardinality(revisions) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'revisions: want aggregate_types, aggregate_ids and revisions of one length';
    END IF;
    IF EXISTS (SELECT 1 FROM ROWS FROM (pg_catalog.unnest(aggregate_types), pg_catalog.unnest(aggregate_ids), pg_catalog.unnest(revisions)) AS u(t, i, r)
               WHERE u.t IS NULL OR u.i IS NULL OR u.r IS NULL OR u.r < 1 OR pg_catalog.length(u.i) NOT BETWEEN 1 AND 256) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'revisions: want an aggregate type, an ID of 1 to 256 characters and a revision >= 1 each';
    END IF;
    sequences_moved := 0;
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO cur FROM public.outbox_id_seq AS s;
    IF cur < outbox_id THEN
        PERFORM pg_catalog.setval('public.outbox_id_seq', outbox_id, true);
        sequences_moved := sequences_moved + 1;
    END IF;
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO cur FROM public.journal_sequence AS s;
    IF cur < journal_sequence THEN
        PERFORM pg_catalog.setval('public.journal_sequence', journal_sequence, true);
        sequences_moved := sequences_moved + 1;
    END IF;

    CREATE TEMP TABLE failover_revisions ON COMMIT DROP AS
    SELECT u.t AS aggregate_type, u.i AS aggregate_id, max(u.r) AS revision
    FROM ROWS FROM (pg_catalog.unnest(aggregate_types), pg_catalog.unnest(aggregate_ids), pg_catalog.unnest(revisions)) AS u(t, i, r)
    WHERE u.t <> 'journal' GROUP BY u.t, u.i;
    INSERT INTO public.accounts (id, revision)
    SELECT f.aggregate_id, 0 FROM pg_temp.failover_revisions AS f WHERE f.aggregate_type = 'account' ORDER BY 1 ON CONFLICT DO NOTHING;
    UPDATE public.accounts AS a SET revision = f.revision
    FROM pg_temp.failover_revisions AS f WHERE f.aggregate_type = 'account' AND a.id = f.aggregate_id
      AND GREATEST(a.revision, (SELECT l.revision FROM public.journal_lines AS l WHERE l.account_id = a.id
                                ORDER BY l.revision DESC LIMIT 1)) < f.revision;
    GET DIAGNOSTICS aggregates_moved = ROW_COUNT;
    INSERT INTO public.posthorn_aggregates AS a (aggregate_type, aggregate_id, revision)
    SELECT f.aggregate_type, f.aggregate_id, f.revision FROM pg_temp.failover_revisions AS f WHERE f.aggregate_type <> 'account'
    ON CONFLICT ON CONSTRAINT posthorn_aggregates_pkey DO UPDATE SET revision = EXCLUDED.revision
    WHERE GREATEST(a.revision, (SELECT pg_catalog.max(o.revision) FROM public.outbox AS o
                                WHERE o.aggregate_type = a.aggregate_type AND o.aggregate_id = a.aggregate_id)) < EXCLUDED.revision;
    GET DIAGNOSTICS n = ROW_COUNT;
    aggregates_moved := aggregates_moved + n;
    DROP TABLE pg_temp.failover_revisions;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The functions, the trigger and the view stay: this posthorn.write needs
-- the trigger, and the Posting API reads the view. The floors are raised
-- to the newest revisions, which the earlier bumps would need.
UPDATE accounts AS a SET revision = r.revision FROM account_revisions AS r WHERE r.id = a.id AND a.revision < r.revision;
UPDATE posthorn_aggregates AS a SET revision = n.revision
FROM (SELECT o.aggregate_type, o.aggregate_id, max(o.revision) AS revision FROM outbox AS o
      GROUP BY o.aggregate_type, o.aggregate_id) AS n
WHERE a.aggregate_type = n.aggregate_type AND a.aggregate_id = n.aggregate_id AND a.revision < n.revision;
