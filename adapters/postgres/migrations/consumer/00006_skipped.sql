-- +goose Up
-- skipped: the event is a skip marker (type posthorn.dead_lettered) that
-- the relay sent in place of a record an operator dead-lettered because the
-- sink could never take it. The handler is not called; an ordered consumer
-- advances past the revision, so the aggregate's later events apply. It is
-- final, and named: the gap is never silent.
ALTER TABLE consumer_inbox DROP CONSTRAINT consumer_inbox_disposition_check;
ALTER TABLE consumer_inbox ADD CONSTRAINT consumer_inbox_disposition_check CHECK (disposition IN
    ('held', 'applied', 'duplicate', 'parked_gap', 'parked_poison', 'rejected', 'revision_conflict', 'skipped'));

-- posthorn_inbox_receive answers skip markers for consumers outside Go as
-- the Go inbox does: 00004's rule decides (duplicates, gaps, conflicts and
-- the ordered position stay its rule's); where it would answer apply to a
-- marker, the row is recorded as skipped and the answer is
--   skipped  an operator dead-lettered this revision: do not apply it,
--            commit, and acknowledge the message; the position has moved
--            past it.
-- 00004's function stays, as posthorn_inbox_rule: its body is copied under
-- that name (its parameters are qualified by the function's name, so a
-- rename alone would break it), and posthorn_inbox_receive, replaced in
-- place (its grants stay), calls it. Both run with the caller's rights.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE replace(pg_get_functiondef('posthorn_inbox_receive(text, jsonb, boolean)'::regprocedure),
                    'posthorn_inbox_receive', 'posthorn_inbox_rule');
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION posthorn_inbox_receive(consumer text, headers jsonb, ordered boolean DEFAULT true)
    RETURNS TABLE (disposition text, waits_for bigint)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    SELECT r.disposition, r.waits_for INTO disposition, waits_for
    FROM posthorn_inbox_rule(consumer, headers, ordered) r;
    IF disposition = 'apply' AND posthorn_inbox_receive.headers->>'type' = 'posthorn.dead_lettered' THEN
        UPDATE consumer_inbox i SET disposition = 'skipped', updated_at = now(),
               reason = format('skipped: revision %s was dead-lettered by an operator (the record is in the ledger''s dead_letters table)',
                               posthorn_inbox_receive.headers->>'revision')
        WHERE i.consumer = posthorn_inbox_receive.consumer AND i.event_id = posthorn_inbox_receive.headers->>'event_id';
        disposition := 'skipped';
    END IF;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE replace(pg_get_functiondef('posthorn_inbox_rule(text, jsonb, boolean)'::regprocedure),
                    'posthorn_inbox_rule', 'posthorn_inbox_receive');
END
$$;
-- +goose StatementEnd
DROP FUNCTION posthorn_inbox_rule(text, jsonb, boolean);
UPDATE consumer_inbox SET disposition = 'applied' WHERE disposition = 'skipped';
ALTER TABLE consumer_inbox DROP CONSTRAINT consumer_inbox_disposition_check;
ALTER TABLE consumer_inbox ADD CONSTRAINT consumer_inbox_disposition_check CHECK (disposition IN
    ('held', 'applied', 'duplicate', 'parked_gap', 'parked_poison', 'rejected', 'revision_conflict'));
