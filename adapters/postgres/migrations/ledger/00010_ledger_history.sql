-- +goose Up
-- The ledger's own history: which PostgreSQL server and timeline it runs on,
-- and which of them an operator has accepted.
--
-- Why: when the primary fails over to an asynchronous standby, the new
-- primary lacks the last postings the old one committed, and the relay may
-- already have published them. Its sequences and revisions then reissue
-- what the world has seen. Promotion (and a point-in-time restore) starts a
-- new timeline, and a dump restored elsewhere runs on another system
-- identifier, so the pair (system identifier, timeline) names one linear
-- history. Publishing is safe only on the history an operator accepted:
-- posthorn migrate accepts the one it runs on, and after a failover the
-- failover check accepts the new one once nothing can be reissued.
CREATE TABLE posthorn.ledger_timelines (
    system_identifier bigint      NOT NULL,
    timeline          int         NOT NULL CHECK (timeline >= 1),
    accepted_at       timestamptz NOT NULL DEFAULT pg_catalog.now(),
    accepted_by       text        NOT NULL CHECK (accepted_by <> ''),
    note              text        NOT NULL DEFAULT '',
    PRIMARY KEY (system_identifier, timeline)
);

-- +goose StatementBegin
-- posthorn.ledger_history is the server's history now: its system
-- identifier and the timeline WAL is written on. pg_walfile_name of the
-- insert position carries the insertion timeline, which promotion changes
-- at once (the checkpoint's timeline lags until the first checkpoint
-- after promotion). On a standby in recovery it raises, as there is no
-- history to write on.
CREATE FUNCTION posthorn.ledger_history(OUT system_identifier bigint, OUT timeline int)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT s.system_identifier FROM pg_catalog.pg_control_system() AS s),
           ('x' || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::int
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.ledger_history_accepted says whether the server's history now is
-- the one accepted last; the relay publishes only while it is.
CREATE FUNCTION posthorn.ledger_history_accepted(OUT accepted boolean, OUT system_identifier bigint, OUT timeline int,
        OUT accepted_system_identifier bigint, OUT accepted_timeline int)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.system_identifier IS NOT DISTINCT FROM h.system_identifier AND a.timeline IS NOT DISTINCT FROM h.timeline,
           h.system_identifier, h.timeline, a.system_identifier, a.timeline
    FROM posthorn.ledger_history() AS h
    LEFT JOIN LATERAL (SELECT t.system_identifier, t.timeline FROM posthorn.ledger_timelines AS t
                       ORDER BY t.accepted_at DESC, t.timeline DESC LIMIT 1) AS a ON true
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- posthorn.accept_ledger_history records the server's history now as
-- accepted. Idempotent: accepting the accepted history again changes
-- nothing.
CREATE FUNCTION posthorn.accept_ledger_history(accepted_by text, note text DEFAULT '')
    RETURNS void LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO posthorn.ledger_timelines (system_identifier, timeline, accepted_by, note)
    SELECT h.system_identifier, h.timeline, accepted_by, note FROM posthorn.ledger_history() AS h
    ON CONFLICT (system_identifier, timeline) DO NOTHING
$$;
-- +goose StatementEnd

SELECT posthorn.accept_ledger_history('posthorn migrate', 'the history the ledger was migrated on');

REVOKE ALL ON FUNCTION posthorn.ledger_history(), posthorn.ledger_history_accepted(),
    posthorn.accept_ledger_history(text, text) FROM PUBLIC;

-- +goose Down
DROP FUNCTION posthorn.accept_ledger_history(text, text);
DROP FUNCTION posthorn.ledger_history_accepted();
DROP FUNCTION posthorn.ledger_history();
DROP TABLE posthorn.ledger_timelines;
