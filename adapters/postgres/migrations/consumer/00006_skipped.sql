-- +goose Up
-- skipped: the event is a skip marker (type posthorn.dead_lettered) that
-- the relay sent in place of a record an operator dead-lettered because the
-- sink could never take it. The handler is not called; an ordered consumer
-- advances past the revision, so the aggregate's later events apply. It is
-- final, and named: the gap is never silent.
ALTER TABLE consumer_inbox DROP CONSTRAINT consumer_inbox_disposition_check;
ALTER TABLE consumer_inbox ADD CONSTRAINT consumer_inbox_disposition_check CHECK (disposition IN
    ('held', 'applied', 'duplicate', 'parked_gap', 'parked_poison', 'rejected', 'revision_conflict', 'skipped'));

-- +goose Down
UPDATE consumer_inbox SET disposition = 'applied' WHERE disposition = 'skipped';
ALTER TABLE consumer_inbox DROP CONSTRAINT consumer_inbox_disposition_check;
ALTER TABLE consumer_inbox ADD CONSTRAINT consumer_inbox_disposition_check CHECK (disposition IN
    ('held', 'applied', 'duplicate', 'parked_gap', 'parked_poison', 'rejected', 'revision_conflict'));
