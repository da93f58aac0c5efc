-- +goose Up
-- Operations: verified consumer coverage, archive coverage, the cleanup
-- floor and replay progress. Every row here is written only after the fact
-- it records was proven (reconcile clean, segment fsynced and re-read).

-- Per consumer, the last verified boundary: every event of every journal
-- with sequence <= cut_sequence has a disposition, and every outbox row with
-- id <= covered_outbox_id is final and belongs to such a journal (or is a
-- command). Only ever advanced.
CREATE TABLE ops_coverage (
    consumer          text        PRIMARY KEY,
    cut_sequence      bigint      NOT NULL CHECK (cut_sequence >= 0),
    covered_outbox_id bigint      NOT NULL CHECK (covered_outbox_id >= 0),
    verified_at       timestamptz NOT NULL DEFAULT now()
);

-- One row per archive segment, written after the segment and the manifest
-- were fsynced and read back with a matching SHA-256. Segments are
-- contiguous: each covers outbox ids first_id..last_id (inclusive) and the
-- next one starts at last_id + 1, so archive coverage is max(last_id).
CREATE TABLE ops_archive_segments (
    segment        text        PRIMARY KEY,
    first_id       bigint      NOT NULL,
    last_id        bigint      NOT NULL,
    rows           bigint      NOT NULL CHECK (rows >= 0),
    first_event_id text,
    last_event_id  text,
    sha256         text        NOT NULL,
    verified_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (last_id >= first_id),
    UNIQUE (first_id)
);

-- What cleanup has deleted: outbox rows up to deleted_through_id (those that
-- were eligible), and journal_floor, the highest journal sequence such that
-- no outbox row of any journal at or below it is left. Reconciliation
-- starts above the floor. A single row.
CREATE TABLE ops_cleanup (
    singleton          boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    deleted_through_id bigint      NOT NULL DEFAULT 0,
    journal_floor      bigint      NOT NULL DEFAULT 0,
    deleted_rows       bigint      NOT NULL DEFAULT 0,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Resumable replays: the last outbox id ACKed by the sink under a replay
-- name, and the replay's range, so a resume with another range is refused.
CREATE TABLE ops_replay_progress (
    name          text        PRIMARY KEY,
    spec          jsonb       NOT NULL,
    last_id       bigint      NOT NULL DEFAULT 0,
    sent          bigint      NOT NULL DEFAULT 0,
    done          boolean     NOT NULL DEFAULT false,
    started_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE ops_replay_progress;
DROP TABLE ops_cleanup;
DROP TABLE ops_archive_segments;
DROP TABLE ops_coverage;
