-- +goose Up
-- The inbox's protocol in SQL, for consumers outside Go: a
-- Python, Java or shell consumer calls posthorn_inbox_receive in its own
-- transaction with the event's wire headers, before its effect, and gets
-- the same exactly-once effect and gap detection as the Go middleware, on
-- the same tables (so reconciliation and retention see these consumers
-- too). The answer:
--   apply      the event is recorded as applied: write the effect in this
--              transaction and commit (a rollback undoes both);
--   duplicate  already applied (the same event ID, or for an ordered
--              consumer a revision at or below the last applied): do
--              nothing, commit, and acknowledge the message;
--   gap        an ordered consumer's revision ahead of the next one
--              (waits_for): nothing is recorded; do not acknowledge it, so
--              the broker redelivers it once the predecessor has come;
--   parked     the aggregate is parked (an operator releases it): nothing
--              is recorded; do not acknowledge it.
-- ordered = false is for a consumer whose effect does not depend on the
-- predecessor: every new event ID is applied.
--
-- Locking is the Go inbox's: the aggregate's position row first (ordered),
-- then the inbox row, whose primary key makes a second instance receiving
-- the same event wait and then see a duplicate.
-- +goose StatementBegin
CREATE FUNCTION posthorn_inbox_receive(consumer text, headers jsonb, ordered boolean DEFAULT true)
    RETURNS TABLE (disposition text, waits_for bigint)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    h text;
    eid text := headers->>'event_id';
    atype text := headers->>'aggregate_type';
    aid text := headers->>'aggregate_id';
    ekind text := headers->>'kind';
    etype text := headers->>'type';
    rev bigint;
    last bigint := 0;
    is_parked boolean := false;
    inserted boolean;
BEGIN
    IF consumer IS NULL OR consumer = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'consumer: is required';
    END IF;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'headers: want the record''s headers as a JSON object';
    END IF;
    FOREACH h IN ARRAY ARRAY['event_id', 'kind', 'type', 'aggregate_type', 'aggregate_id', 'revision'] LOOP
        IF coalesce(headers->>h, '') = '' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('headers: %s is missing', h);
        END IF;
    END LOOP;
    IF headers->>'revision' !~ '^[1-9][0-9]{0,18}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('headers: revision is %s, want a positive integer', quote_literal(headers->>'revision'));
    END IF;
    rev := (headers->>'revision')::bigint;

    IF ordered THEN
        INSERT INTO consumer_positions (consumer, aggregate_type, aggregate_id)
        VALUES (posthorn_inbox_receive.consumer, atype, aid) ON CONFLICT DO NOTHING;
        SELECT p.last_revision, p.parked INTO last, is_parked FROM consumer_positions p
        WHERE p.consumer = posthorn_inbox_receive.consumer AND p.aggregate_type = atype AND p.aggregate_id = aid
        FOR UPDATE;
        IF is_parked THEN
            disposition := 'parked'; waits_for := last + 1;
            RETURN NEXT; RETURN;
        END IF;
        IF rev > last + 1 THEN
            -- A known event ID ahead of the line is still a gap: answer
            -- before the inbox row, so nothing is recorded for it.
            IF NOT EXISTS (SELECT 1 FROM consumer_inbox i
                           WHERE i.consumer = posthorn_inbox_receive.consumer AND i.event_id = eid) THEN
                disposition := 'gap'; waits_for := last + 1;
                RETURN NEXT; RETURN;
            END IF;
        END IF;
    END IF;

    INSERT INTO consumer_inbox (consumer, event_id, kind, type, aggregate_type, aggregate_id, revision, disposition)
    VALUES (posthorn_inbox_receive.consumer, eid, ekind, etype, atype, aid, rev, 'applied')
    ON CONFLICT (consumer, event_id) DO NOTHING;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    IF NOT inserted THEN
        UPDATE consumer_inbox i SET duplicates = i.duplicates + 1, updated_at = now()
        WHERE i.consumer = posthorn_inbox_receive.consumer AND i.event_id = eid;
        disposition := 'duplicate';
        RETURN NEXT; RETURN;
    END IF;
    IF ordered THEN
        IF rev <= last THEN
            UPDATE consumer_inbox i SET disposition = 'duplicate', updated_at = now(),
                   reason = format('revision %s already applied (last applied %s)', rev, last)
            WHERE i.consumer = posthorn_inbox_receive.consumer AND i.event_id = eid;
            disposition := 'duplicate';
            RETURN NEXT; RETURN;
        END IF;
        UPDATE consumer_positions p SET last_revision = rev, updated_at = now()
        WHERE p.consumer = posthorn_inbox_receive.consumer AND p.aggregate_type = atype AND p.aggregate_id = aid;
    END IF;
    disposition := 'apply';
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- Functions are executable by PUBLIC by default; roles/consumer.sql grants
-- it to the consumer role.
REVOKE ALL ON FUNCTION posthorn_inbox_receive(text, jsonb, boolean) FROM PUBLIC;

-- +goose Down
DROP FUNCTION posthorn_inbox_receive(text, jsonb, boolean);
