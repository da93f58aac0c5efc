-- +goose Up
-- A posting no longer writes a new version of its balances' rows.
--
-- A posting added its net delta to account_balances (INSERT ... ON
-- CONFLICT DO UPDATE): a new version of the row per posting of each
-- account and currency. While a long snapshot holds the horizon none of
-- them can be pruned, and every later posting of the account walks them
-- all to find the live one (the same cost 00018 took off the account's
-- revision). Now each journal line carries the balance its account has in
-- its currency after it (balance_after), and a balance is read from its
-- newest line through the index below: lines are inserted, never updated
-- by a posting, so no dead version stands in front of that entry.
--
-- Lines written before this migration carry no balance_after. Their sum
-- per account and currency is what account_balances held when it ran: that
-- table becomes account_opening_balances, the balance before the first
-- line that carries one, and the list of every (account, currency) the
-- ledger has. A posting inserts a new pair's row at 0 and never updates
-- one. account_balances is now a view: the newest line's balance_after,
-- or the opening balance while no line carries one. Every line that
-- carries a balance is newer than every line that does not (revisions only
-- grow, and a failover recovery re-commits lost lines above the surviving
-- ones), so balance_after = opening + every delta up to the line.
--
-- The index is built in this transaction, reading every journal line
-- once; postings wait for it.
ALTER TABLE account_balances RENAME TO account_opening_balances;
ALTER TABLE account_opening_balances RENAME CONSTRAINT account_balances_pkey TO account_opening_balances_pkey;
ALTER TABLE account_opening_balances RENAME CONSTRAINT account_balances_account_id_fkey TO account_opening_balances_account_id_fkey;
ALTER TABLE account_opening_balances RENAME CONSTRAINT account_balances_currency_check TO account_opening_balances_currency_check;
-- No posting updates these rows any more (00018 took the accounts' and
-- aggregates' bumps off): the room 00017 left on their pages for updates
-- is no longer needed.
ALTER TABLE account_opening_balances RESET (fillfactor);
ALTER TABLE accounts RESET (fillfactor);
ALTER TABLE posthorn_aggregates RESET (fillfactor);
ALTER TABLE journal_lines ADD COLUMN balance_after bigint;
CREATE INDEX journal_lines_account_currency ON journal_lines (account_id, currency, revision);

CREATE VIEW account_balances AS
SELECT o.account_id, o.currency,
       coalesce((SELECT l.balance_after FROM journal_lines AS l WHERE l.account_id = o.account_id AND l.currency = o.currency
                 ORDER BY l.revision DESC LIMIT 1), o.balance) AS balance
FROM account_opening_balances AS o;

-- +goose StatementBegin
-- posthorn.failover_recommit as in 00012, its balances carried by the
-- lines: each re-committed line's balance_after, and those of the
-- account's later lines in its currency, which stand above it when the
-- recovery re-committed a later posting of the account first.
CREATE OR REPLACE FUNCTION posthorn.failover_recommit(journal_id uuid, posted_at timestamptz, lines jsonb)
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
    INSERT INTO public.account_opening_balances (account_id, currency, balance)
    SELECT DISTINCT f.account, f.currency, 0 FROM pg_temp.failover_lines AS f ORDER BY 1, 2 ON CONFLICT DO NOTHING;

    seq := pg_catalog.nextval('public.journal_sequence');
    INSERT INTO public.journals (id, sequence, metadata, posted_at) VALUES (journal_id, seq, '{}', posted_at);
    INSERT INTO public.journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision)
    SELECT failover_recommit.journal_id, f.line_no, f.account, CASE WHEN f.delta > 0 THEN 'credit' ELSE 'debit' END,
           pg_catalog.abs(f.delta), f.currency, f.revision
    FROM pg_temp.failover_lines AS f ORDER BY f.line_no;
    UPDATE public.journal_lines AS x SET balance_after = r.balance
    FROM (SELECT jl.account_id, jl.revision,
                 b.base + sum(CASE WHEN jl.direction = 'credit' THEN jl.amount ELSE -jl.amount END)
                     OVER (PARTITION BY jl.account_id, jl.currency ORDER BY jl.revision) AS balance
          FROM (SELECT f.account, f.currency, pg_catalog.min(f.revision) AS from_revision
                FROM pg_temp.failover_lines AS f GROUP BY f.account, f.currency) AS m
          CROSS JOIN LATERAL (SELECT coalesce(
              (SELECT p.balance_after FROM public.journal_lines AS p
               WHERE p.account_id = m.account AND p.currency = m.currency AND p.revision < m.from_revision
               ORDER BY p.revision DESC LIMIT 1),
              (SELECT o.balance FROM public.account_opening_balances AS o
               WHERE o.account_id = m.account AND o.currency = m.currency)) AS base) AS b
          JOIN public.journal_lines AS jl
            ON jl.account_id = m.account AND jl.currency = m.currency AND jl.revision >= m.from_revision) AS r
    WHERE x.account_id = r.account_id AND x.revision = r.revision;
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

-- +goose Down
-- The balances go back into the table the earlier Posting API updates,
-- each at its newest line's, and failover_recommit as in 00012.
UPDATE account_opening_balances AS o SET balance = l.balance_after
FROM (SELECT DISTINCT ON (account_id, currency) account_id, currency, balance_after FROM journal_lines
      WHERE balance_after IS NOT NULL ORDER BY account_id, currency, revision DESC) AS l
WHERE o.account_id = l.account_id AND o.currency = l.currency;
DROP VIEW account_balances;
DROP INDEX journal_lines_account_currency;
ALTER TABLE journal_lines DROP COLUMN balance_after;
ALTER TABLE account_opening_balances RENAME CONSTRAINT account_opening_balances_pkey TO account_balances_pkey;
ALTER TABLE account_opening_balances RENAME CONSTRAINT account_opening_balances_account_id_fkey TO account_balances_account_id_fkey;
ALTER TABLE account_opening_balances RENAME CONSTRAINT account_opening_balances_currency_check TO account_balances_currency_check;
ALTER TABLE account_opening_balances RENAME TO account_balances;
ALTER TABLE account_balances SET (fillfactor = 50);
ALTER TABLE accounts SET (fillfactor = 50);
ALTER TABLE posthorn_aggregates SET (fillfactor = 50);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION posthorn.failover_recommit(journal_id uuid, posted_at timestamptz, lines jsonb)
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
