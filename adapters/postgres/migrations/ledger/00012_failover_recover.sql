-- +goose Up
-- Recovery after the ledger failed over to a standby that missed postings
-- the relay had already published (posthorn failover recover).
--
-- The world (consumers, the sink) holds events the new primary lacks: the
-- lost events. Left alone, the new primary reissues their account
-- revisions, outbox ids and journal sequence numbers to new postings. These
-- functions let the recovery
--   - re-commit a lost posting from its published events, with its
--     original journal ID, event IDs and revisions
--     (posthorn.failover_recommit);
--   - move the sequences and every aggregate's revision past what was
--     published (posthorn.failover_advance);
--   - name each lost event it could not rebuild, once
--     (posthorn.failover_lost, posthorn.failover_record_lost);
--   - accept the new history, so the relay resumes
--     (posthorn.failover_accept).
-- They are SECURITY DEFINER in the schema posthorn with search_path
-- pg_catalog, pg_temp (00009's rules): posthorn migrate --roles hands them
-- to posthorn_definer and grants them to posthorn_maintainer only
-- (roles/ledger.sql), so the role that runs the recovery writes journals
-- through these checks and never at will. Every refusal raises SQLSTATE
-- 22023 with a message that starts with the field's name.

-- The lost events a recovery named and could not rebuild: recorded so that
-- a second run knows them (and has nothing to do), and so that what the
-- ledger lacks stays on record.
CREATE TABLE posthorn.failover_lost (
    event_id          uuid        PRIMARY KEY,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    revision          bigint      NOT NULL CHECK (revision >= 1),
    journal_id        uuid,
    reason            text        NOT NULL CHECK (reason <> ''),
    seen_by           text        NOT NULL,
    system_identifier bigint      NOT NULL,
    timeline          int         NOT NULL,
    recorded_at       timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- +goose StatementBegin
-- posthorn.failover_recommit re-commits the lost posting journal_id from
-- its published events (lines: a JSON array, in line order, of objects with
-- event_id, account, revision, currency, delta (signed minor units, credit
-- positive, as the event's payload says), payload (the event's payload, a
-- JSON object) and headers (its non-contract headers)). It writes the
-- journal (a new sequence number, taken after the recovery moved the
-- sequence past the old primary's: the old number is not on the wire), its
-- lines, the balances, each account's revision (at least the line's) and
-- each event's outbox row with its original event ID and revision, marked
-- relayed in the same transaction: the world has these events already, and
-- a second send would only come back as a duplicate. It returns the
-- journal's sequence, or NULL when the journal is in the ledger already
-- (a second run changes nothing). It refuses lines that do not balance per
-- currency, an event ID the outbox has, and a revision another line holds
-- (reissued: the posting cannot be rebuilt where it was).
CREATE FUNCTION posthorn.failover_recommit(journal_id uuid, posted_at timestamptz, lines jsonb)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l record;
    seq bigint;
    taken text;
BEGIN
    IF journal_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'journal_id: is required';
    END IF;
    IF posted_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'posted_at: is required';
    END IF;
    IF lines IS NULL OR pg_catalog.jsonb_typeof(lines) <> 'array' OR pg_catalog.jsonb_array_length(lines) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'lines: want a non-empty JSON array';
    END IF;
    IF EXISTS (SELECT 1 FROM public.journals AS j WHERE j.id = failover_recommit.journal_id) THEN
        RETURN NULL;
    END IF;

    CREATE TEMP TABLE failover_lines ON COMMIT DROP AS
    SELECT (e.ord)::int AS line_no, (e.v->>'event_id')::uuid AS event_id, e.v->>'account' AS account,
           (e.v->>'revision')::bigint AS revision, e.v->>'currency' AS currency, (e.v->>'delta')::bigint AS delta,
           e.v->'payload' AS payload, coalesce(e.v->'headers', '{}'::jsonb) AS headers
    FROM pg_catalog.jsonb_array_elements(lines) WITH ORDINALITY AS e(v, ord);
    FOR l IN SELECT * FROM pg_temp.failover_lines AS f ORDER BY f.line_no LOOP
        IF l.event_id IS NULL OR l.account IS NULL OR pg_catalog.length(l.account) NOT BETWEEN 1 AND 256 OR l.revision IS NULL
           OR l.revision < 1 OR l.currency IS NULL OR l.currency !~ '^[A-Z]{3}$' OR l.delta IS NULL OR l.delta = 0
           OR l.payload IS NULL OR pg_catalog.jsonb_typeof(l.payload) <> 'object' OR pg_catalog.jsonb_typeof(l.headers) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
                'lines[%s]: want event_id, account, revision >= 1, currency (three capitals), a non-zero delta, a payload object and a headers object',
                l.line_no - 1);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_temp.failover_lines AS f GROUP BY f.currency HAVING sum(f.delta) <> 0) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'lines: journal %s does not balance per currency: some of its events were not read', journal_id);
    END IF;
    SELECT pg_catalog.string_agg(pg_catalog.format('%s revision %s', pg_catalog.quote_literal(f.account), f.revision), ', ') INTO taken
    FROM pg_temp.failover_lines AS f
    WHERE EXISTS (SELECT 1 FROM public.journal_lines AS x WHERE x.account_id = f.account AND x.revision = f.revision)
       OR EXISTS (SELECT 1 FROM public.outbox AS o WHERE o.aggregate_type = 'account' AND o.aggregate_id = f.account AND o.revision = f.revision)
       OR EXISTS (SELECT 1 FROM public.outbox AS o WHERE o.event_id = f.event_id);
    IF taken IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format(
            'lines: journal %s cannot be rebuilt where it was: %s are held by other postings (reissued)', journal_id, taken);
    END IF;

    -- The accounts, locked in one order as the Posting API locks them.
    INSERT INTO public.accounts (id)
    SELECT DISTINCT f.account FROM pg_temp.failover_lines AS f ORDER BY 1 ON CONFLICT DO NOTHING;
    PERFORM 1 FROM public.accounts AS a WHERE a.id IN (SELECT f.account FROM pg_temp.failover_lines AS f)
        ORDER BY a.id COLLATE "C" FOR UPDATE;
    UPDATE public.accounts AS a SET revision = GREATEST(a.revision, m.revision)
    FROM (SELECT f.account, max(f.revision) AS revision FROM pg_temp.failover_lines AS f GROUP BY f.account) AS m
    WHERE a.id = m.account;
    INSERT INTO public.account_balances AS b (account_id, currency, balance)
    SELECT f.account, f.currency, sum(f.delta) FROM pg_temp.failover_lines AS f GROUP BY f.account, f.currency
    ON CONFLICT (account_id, currency) DO UPDATE SET balance = b.balance + EXCLUDED.balance;

    seq := pg_catalog.nextval('public.journal_sequence');
    INSERT INTO public.journals (id, sequence, metadata, posted_at) VALUES (journal_id, seq, '{}', posted_at);
    INSERT INTO public.journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision)
    SELECT failover_recommit.journal_id, f.line_no, f.account, CASE WHEN f.delta > 0 THEN 'credit' ELSE 'debit' END,
           pg_catalog.abs(f.delta), f.currency, f.revision
    FROM pg_temp.failover_lines AS f ORDER BY f.line_no;
    INSERT INTO public.outbox (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard, journal_id,
                               headers, payload, occurred_at)
    SELECT f.event_id, 'event', 'ledger.account.posted', 'ledger.events', 'account', f.account, f.revision,
           posthorn.shard(f.account), failover_recommit.journal_id, f.headers,
           pg_catalog.convert_to(f.payload::text, 'UTF8'), posted_at
    FROM pg_temp.failover_lines AS f ORDER BY f.account, f.revision;
    -- Already on the wire: the relay must not send them as new.
    DELETE FROM public.outbox_pending AS p USING public.outbox AS o
    WHERE o.event_id IN (SELECT f.event_id FROM pg_temp.failover_lines AS f) AND p.shard = o.shard AND p.id = o.id;
    DROP TABLE pg_temp.failover_lines;
    RETURN seq;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.failover_advance moves the outbox ids and the journal sequence
-- so that their next values are above outbox_id and journal_sequence, and
-- every aggregate named (parallel arrays) to at least its revision: the
-- ledger's accounts in accounts, a service's aggregates in
-- posthorn_aggregates (a journal's commands are numbered per journal and
-- need nothing). Nothing moves backwards, so a second call with the same
-- arguments changes nothing. It returns how many sequences and aggregates
-- it moved.
CREATE FUNCTION posthorn.failover_advance(outbox_id bigint, journal_sequence bigint,
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
    FROM pg_temp.failover_revisions AS f WHERE f.aggregate_type = 'account' AND a.id = f.aggregate_id AND a.revision < f.revision;
    GET DIAGNOSTICS aggregates_moved = ROW_COUNT;
    INSERT INTO public.posthorn_aggregates AS a (aggregate_type, aggregate_id, revision)
    SELECT f.aggregate_type, f.aggregate_id, f.revision FROM pg_temp.failover_revisions AS f WHERE f.aggregate_type <> 'account'
    ON CONFLICT ON CONSTRAINT posthorn_aggregates_pkey DO UPDATE SET revision = EXCLUDED.revision
    WHERE a.revision < EXCLUDED.revision;
    GET DIAGNOSTICS n = ROW_COUNT;
    aggregates_moved := aggregates_moved + n;
    DROP TABLE pg_temp.failover_revisions;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.failover_record_lost records a lost event the recovery could
-- not rebuild, on the history it runs on. A second record of the event
-- changes nothing; it returns whether this one was new.
CREATE FUNCTION posthorn.failover_record_lost(event_id uuid, aggregate_type text, aggregate_id text, revision bigint,
        journal_id uuid, reason text, seen_by text)
    RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n int;
BEGIN
    IF event_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'event_id: is required';
    END IF;
    IF reason IS NULL OR reason = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'reason: is required';
    END IF;
    INSERT INTO posthorn.failover_lost (event_id, aggregate_type, aggregate_id, revision, journal_id, reason, seen_by,
                                        system_identifier, timeline)
    SELECT event_id, aggregate_type, aggregate_id, revision, journal_id, reason, coalesce(seen_by, ''),
           h.system_identifier, h.timeline
    FROM posthorn.ledger_history() AS h
    ON CONFLICT ON CONSTRAINT failover_lost_pkey DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.failover_accept accepts the history the ledger runs on now
-- (posthorn.accept_ledger_history) as the failover recovery's: the relay
-- resumes on it. It accepts only the server's own history, never one a
-- caller names.
CREATE FUNCTION posthorn.failover_accept(note text)
    RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT posthorn.accept_ledger_history('posthorn failover recover', coalesce(note, ''))
$$;
-- +goose StatementEnd

REVOKE ALL ON TABLE posthorn.failover_lost FROM PUBLIC;
REVOKE ALL ON FUNCTION posthorn.failover_recommit(uuid, timestamptz, jsonb),
    posthorn.failover_advance(bigint, bigint, text[], text[], bigint[]),
    posthorn.failover_record_lost(uuid, text, text, bigint, uuid, text, text),
    posthorn.failover_accept(text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION posthorn.failover_accept(text);
DROP FUNCTION posthorn.failover_record_lost(uuid, text, text, bigint, uuid, text, text);
DROP FUNCTION posthorn.failover_advance(bigint, bigint, text[], text[], bigint[]);
DROP FUNCTION posthorn.failover_recommit(uuid, timestamptz, jsonb);
DROP TABLE posthorn.failover_lost;
