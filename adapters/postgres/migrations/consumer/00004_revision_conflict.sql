-- +goose Up
-- A duplicate is the same event ID, nothing else. An event that arrives at
-- a revision its aggregate already applied under another event ID is a
-- revision conflict (a ledger that failed over to a standby missing its last
-- postings reissues revisions the world has already seen): it is recorded
-- as revision_conflict, naming the applied event in conflicts_with, kept
-- with its headers and payload, and never applied; an ordered consumer
-- parks the aggregate. Reconciliation never counts it as covered, and
-- retention never prunes it (it prunes applied and duplicate rows only).
ALTER TABLE consumer_inbox DROP CONSTRAINT consumer_inbox_disposition_check;
ALTER TABLE consumer_inbox ADD CONSTRAINT consumer_inbox_disposition_check CHECK (disposition IN
    ('held', 'applied', 'duplicate', 'parked_gap', 'parked_poison', 'rejected', 'revision_conflict'));
-- The event ID that was applied at the revision (revision_conflict only).
ALTER TABLE consumer_inbox ADD COLUMN conflicts_with text;

-- Which event ID an aggregate's revision was applied under: looked up for
-- every new event of an unordered consumer, and for an ordered consumer's
-- event at or below its aggregate's last applied revision.
CREATE INDEX consumer_inbox_revision ON consumer_inbox (consumer, aggregate_type, aggregate_id, revision);

-- posthorn_inbox_receive (00003) with the rule above, the Go inbox's
-- (adapters/postgres/inbox.go). The answers are those of 00003 plus
--   revision_conflict  another event ID was applied at this revision: the
--                      event is recorded as revision_conflict with both
--                      IDs and not applied; an ordered consumer's
--                      aggregate is parked. Do nothing, commit, and
--                      acknowledge the message: an operator takes it from
--                      here (docs/operations.md).
-- and duplicate now means only the same event ID, or (ordered) a revision at
-- or below the last applied one whose applied event this inbox no longer
-- has (a baseline's positions, or rows retention removed), so the IDs
-- cannot be compared. A revision at or below the last applied one is
-- answered whether or not the aggregate is parked, as the Go inbox does.
-- The headers are kept on a conflict; the payload is the caller's and is
-- not passed in.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION posthorn_inbox_receive(consumer text, headers jsonb, ordered boolean DEFAULT true)
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
    park_reason text;
    inserted boolean;
    applied_as text;
    why text;
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
        SELECT p.last_revision, p.parked, coalesce(p.parked_reason, '') INTO last, is_parked, park_reason
        FROM consumer_positions p
        WHERE p.consumer = posthorn_inbox_receive.consumer AND p.aggregate_type = atype AND p.aggregate_id = aid
        FOR UPDATE;
        IF rev > last AND is_parked THEN
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

    IF NOT ordered OR rev <= last THEN
        SELECT i.event_id INTO applied_as FROM consumer_inbox i
        WHERE i.consumer = posthorn_inbox_receive.consumer AND i.aggregate_type = atype AND i.aggregate_id = aid
          AND i.revision = rev AND i.disposition = 'applied' AND i.event_id <> eid
        ORDER BY i.event_id LIMIT 1;
        IF applied_as IS NOT NULL THEN
            why := format('revision_conflict: revision %s applied as event %s, received as event %s', rev, applied_as, eid);
            UPDATE consumer_inbox i SET disposition = 'revision_conflict', conflicts_with = applied_as, reason = why,
                   headers = posthorn_inbox_receive.headers, held_since = now(), updated_at = now()
            WHERE i.consumer = posthorn_inbox_receive.consumer AND i.event_id = eid;
            IF ordered AND NOT (is_parked AND park_reason LIKE 'revision\_conflict:%') THEN
                UPDATE consumer_positions p SET parked = true, parked_reason = why, parked_at = now(), updated_at = now()
                WHERE p.consumer = posthorn_inbox_receive.consumer AND p.aggregate_type = atype AND p.aggregate_id = aid;
                UPDATE consumer_inbox i SET disposition = 'parked_gap', reason = 'aggregate parked: ' || why, updated_at = now()
                WHERE i.consumer = posthorn_inbox_receive.consumer AND i.aggregate_type = atype AND i.aggregate_id = aid
                  AND i.disposition = 'held';
            END IF;
            disposition := 'revision_conflict';
            RETURN NEXT; RETURN;
        END IF;
    END IF;
    IF ordered THEN
        IF rev <= last THEN
            UPDATE consumer_inbox i SET disposition = 'duplicate', updated_at = now(),
                   reason = format('revision %s already applied (last applied %s); no applied event of it is recorded here to compare IDs with', rev, last)
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

-- +goose Down
-- 00003's function again, then the schema.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION posthorn_inbox_receive(consumer text, headers jsonb, ordered boolean DEFAULT true)
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
DROP INDEX consumer_inbox_revision;
-- A recorded conflict stays unproven under the old schema too.
UPDATE consumer_inbox SET disposition = 'parked_poison' WHERE disposition = 'revision_conflict';
ALTER TABLE consumer_inbox DROP COLUMN conflicts_with;
ALTER TABLE consumer_inbox DROP CONSTRAINT consumer_inbox_disposition_check;
ALTER TABLE consumer_inbox ADD CONSTRAINT consumer_inbox_disposition_check CHECK (disposition IN
    ('held', 'applied', 'duplicate', 'parked_gap', 'parked_poison', 'rejected'));
