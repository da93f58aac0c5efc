-- +goose Up
-- The ledger: accounts with a gapless revision and per-currency balances,
-- journals and their lines, idempotency keys, and the outbox. One posting
-- writes all of them in one transaction.

CREATE TABLE accounts (
    id         text        PRIMARY KEY,
    -- Bumped once per journal line under the row lock; gapless 1, 2, 3 …
    revision   bigint      NOT NULL DEFAULT 0 CHECK (revision >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE account_balances (
    account_id text   NOT NULL REFERENCES accounts (id),
    currency   text   NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    -- Minor units, credit positive. int64 range is checked in Go before the
    -- update; bigint overflow here would also abort the transaction.
    balance    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, currency)
);

-- The journal's commit sequence is taken as the last step of the posting
-- transaction, so it follows commit order closely; cuts are defined on it.
CREATE SEQUENCE journal_sequence AS bigint;

CREATE TABLE journals (
    id              uuid        PRIMARY KEY,
    sequence        bigint      NOT NULL UNIQUE,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    posted_at       timestamptz NOT NULL,
    xid             xid8        NOT NULL DEFAULT pg_current_xact_id()
);

CREATE TABLE journal_lines (
    journal_id uuid   NOT NULL REFERENCES journals (id),
    line_no    int    NOT NULL CHECK (line_no >= 1),
    account_id text   NOT NULL REFERENCES accounts (id),
    direction  text   NOT NULL CHECK (direction IN ('debit', 'credit')),
    amount     bigint NOT NULL CHECK (amount > 0),
    currency   text   NOT NULL,
    revision   bigint NOT NULL CHECK (revision >= 1),
    PRIMARY KEY (journal_id, line_no),
    UNIQUE (account_id, revision)
);

-- One row per Idempotency-Key, written by the posting's last statement
-- together with its journal: a concurrent request with the same key blocks
-- on the primary key until the first commits or rolls back, so one key
-- never yields two journals. request_hash is the SHA-256 of the canonical
-- request (core.CanonicalPosting); response is the 201 body, replayed as 200.
CREATE TABLE idempotency_keys (
    key          text        PRIMARY KEY,
    request_hash bytea       NOT NULL,
    journal_id   uuid        NOT NULL REFERENCES journals (id),
    response     jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- The outbox. Rows are written by Watermill's SQL publisher through our
-- schema adapter, inside the posting transaction, and retained after relay
-- until cleanup proves coverage.
--
-- Ordering invariant the relay relies on: an outbox row's id is taken after
-- its aggregate's row lock, so per aggregate, id order is revision order and
-- a row is visible only when all its predecessors are. The relay therefore
-- reads unrelayed rows by id without a cursor and never skips a late commit.
CREATE TABLE outbox (
    id             bigserial   PRIMARY KEY,
    event_id       uuid        NOT NULL UNIQUE,
    kind           text        NOT NULL CHECK (kind IN ('event', 'command')),
    type           text        NOT NULL,
    topic          text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    revision       bigint      NOT NULL CHECK (revision >= 1),
    shard          int         NOT NULL CHECK (shard >= 0),
    journal_id     uuid,
    headers        jsonb       NOT NULL DEFAULT '{}',
    payload        bytea       NOT NULL,
    occurred_at    timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- The writing transaction, for fences and diagnostics.
    xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- The relay's marker: written only after the sink ACKed the row.
    relayed_at     timestamptz,
    relay_token    bigint,
    UNIQUE (aggregate_type, aggregate_id, revision)
);

-- The relay's work queue: only unrelayed rows, per shard, in id order.
CREATE INDEX outbox_unrelayed ON outbox (shard, id) WHERE relayed_at IS NULL;
-- No index on journal_id: every index costs each posting one insert per
-- row, and a journal's rows are found through the unique key above (its
-- lines name its events' aggregate and revision; its commands are the
-- journal aggregate's rows).

-- +goose Down
DROP TABLE outbox;
DROP TABLE idempotency_keys;
DROP TABLE journal_lines;
DROP TABLE journals;
DROP SEQUENCE journal_sequence;
DROP TABLE account_balances;
DROP TABLE accounts;
