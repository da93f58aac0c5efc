-- Privileges of Posthorn's components on the LEDGER database (run in it
-- after the ledger migrations; re-runnable). Each run first revokes
-- everything the component roles hold on the ledger's tables and sequences
-- and then grants exactly what follows, so the result does not depend on
-- what an earlier version granted. Only the tables named here are touched:
-- the consumer schema may live in the same database.
--
-- Rules (tested in privileges_test.go by running each component under its
-- role, and by what each role is refused):
--   posthorn_api         the ledger writer: the only role that writes
--                        accounts, balances, journals and journal lines;
--                        writes the outbox (whose trigger enqueues each row
--                        in outbox_pending), never the relay's marker (the
--                        deletion of a pending row); cannot read the
--                        relay's tables. It deletes no idempotency key
--                        itself: retention goes through
--                        posthorn.prune_idempotency_keys, which deletes
--                        only keys older than the configured lifetime.
--   posthorn_publisher   a team's service: EXECUTE on posthorn.write and
--                        the contract's posthorn_publish and
--                        posthorn_send_command, nothing else (no table).
--   posthorn_definer     owns the SECURITY DEFINER functions of the schema
--                        posthorn and holds only what they do: the
--                        aggregate locks, the outbox insert, the settings'
--                        read, the expired keys' delete. NOLOGIN, no
--                        superuser: a hijacked function could do no more.
--   posthorn_relay       reads the outbox, writes only its markers (deletes
--                        pending rows), its leases, members and parked
--                        aggregates; cannot read journal lines, balances or
--                        journal metadata.
--   posthorn_relay_cdc   posthorn_relay plus the slot lease (the LOGIN role
--                        needs REPLICATION itself; see cluster.sql).
--   posthorn_reconciler  reads the ledger and the outbox; writes only the
--                        verified coverage (ops_coverage).
--   posthorn_maintainer  archive and cleanup: the only role that may DELETE
--                        outbox rows, behind the verified boundary.

REVOKE ALL ON TABLE accounts, account_balances, account_opening_balances, journals, journal_lines, idempotency_keys,
    outbox, outbox_pending, relay_leases, relay_members, relay_parked, relay_cdc_leases,
    ops_coverage, ops_archive_segments, ops_cleanup, ops_replay_progress, console_audit, posthorn_aggregates,
    posthorn_ledger_migrations, posthorn.settings, posthorn.ledger_timelines, posthorn.failover_keys, dead_letters,
    account_revisions, relay_release
    FROM posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler, posthorn_maintainer, posthorn_consumer,
        posthorn_publisher, posthorn_definer;
REVOKE ALL ON SEQUENCE journal_sequence, outbox_id_seq, relay_fencing_token, console_audit_id_seq
    FROM posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler, posthorn_maintainer, posthorn_consumer,
        posthorn_publisher, posthorn_definer;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA posthorn FROM PUBLIC, posthorn_api, posthorn_relay, posthorn_relay_cdc,
    posthorn_reconciler, posthorn_maintainer, posthorn_consumer, posthorn_publisher;
REVOKE ALL ON FUNCTION posthorn_publish(text, text, text, jsonb, jsonb, bigint),
    posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text)
    FROM PUBLIC, posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler, posthorn_maintainer, posthorn_consumer,
        posthorn_publisher;
REVOKE ALL ON SCHEMA posthorn FROM PUBLIC, posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler,
    posthorn_maintainer, posthorn_consumer, posthorn_publisher, posthorn_definer;

GRANT USAGE ON SCHEMA public TO posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler, posthorn_maintainer,
    posthorn_publisher, posthorn_definer;
GRANT USAGE ON SCHEMA posthorn TO posthorn_api, posthorn_maintainer, posthorn_publisher, posthorn_definer;
-- The ledger's history (migration 00010): the API, the relay and the
-- reconciler read which server history they run on and which one was
-- accepted; only the failover check, run by the ledger's owner, accepts one.
GRANT USAGE ON SCHEMA posthorn TO posthorn_relay, posthorn_relay_cdc, posthorn_reconciler;
GRANT SELECT ON posthorn.ledger_timelines TO posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler;
GRANT EXECUTE ON FUNCTION posthorn.ledger_history(), posthorn.ledger_history_accepted()
    TO posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler;

-- posthorn_api: the write path (LedgerStore.Post) and the reads of the API.
-- SELECT … FOR UPDATE on accounts needs an UPDATE privilege: the column one
-- on revision is enough.
GRANT SELECT, INSERT ON accounts TO posthorn_api;
GRANT UPDATE (revision) ON accounts TO posthorn_api;
GRANT SELECT, INSERT ON journals, journal_lines, idempotency_keys TO posthorn_api;
-- A balance is its newest journal line's balance_after (migration 00019):
-- a posting inserts its lines with theirs and a new (account, currency)
-- at an opening balance of 0, and updates no balance.
GRANT SELECT, INSERT ON account_opening_balances TO posthorn_api;
GRANT SELECT ON account_balances TO posthorn_api;
-- An account's revision is the view's (migration 00018): a posting locks
-- its accounts and reads their newest revisions there.
GRANT SELECT ON account_revisions TO posthorn_api;
-- Idempotency keys expire (retention.idempotency_key_ttl): the API prunes
-- them on a schedule through the function, which deletes only keys older
-- than the lifetime posthorn migrate wrote into posthorn.settings. A
-- DELETE of its own would let a stolen API credential forget a key a
-- client is still retrying with, and turn the retry into a second posting.
GRANT EXECUTE ON FUNCTION posthorn.prune_idempotency_keys(timestamptz, integer) TO posthorn_api;
-- A retry of a key a failover recovery restored or recorded lost is
-- answered from posthorn.failover_keys (migration 00015): read only.
GRANT SELECT ON posthorn.failover_keys TO posthorn_api;
GRANT USAGE ON SEQUENCE journal_sequence, outbox_id_seq TO posthorn_api;
-- The outbox: insert the row (never its marker), read it back for
-- GET /v1/postings. No UPDATE and no DELETE at all.
GRANT SELECT ON outbox TO posthorn_api;
GRANT INSERT (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard,
              journal_id, headers, payload, occurred_at) ON outbox TO posthorn_api;
-- The outbox's trigger runs as the inserting role: it enqueues the rows.
GRANT INSERT ON outbox_pending TO posthorn_api;
-- posthorn_publisher: publishing from a team's own service. The functions
-- check each message and write it; a service holds no table privilege, so
-- it cannot write the ledger, forge an account's event, or forget an
-- idempotency key. posthorn_api is a member (cluster.sql).
GRANT EXECUTE ON FUNCTION posthorn.write(text, text, text, text, json, jsonb, bigint, text),
    posthorn_publish(text, text, text, jsonb, jsonb, bigint),
    posthorn_send_command(text, text, text, jsonb, jsonb, bigint, text) TO posthorn_publisher;

-- posthorn_definer: what the functions of the schema posthorn do, and no
-- more. The outbox's trigger runs as the inserting role, so it enqueues
-- in outbox_pending as this one; its delete trigger raises the
-- aggregates' revision floors as this one (migration 00018).
GRANT SELECT, INSERT, UPDATE ON posthorn_aggregates TO posthorn_definer;
GRANT INSERT (event_id, kind, type, topic, aggregate_type, aggregate_id, revision, shard,
              headers, payload, occurred_at) ON outbox TO posthorn_definer;
GRANT INSERT ON outbox_pending TO posthorn_definer;
GRANT USAGE ON SEQUENCE outbox_id_seq TO posthorn_definer;
GRANT SELECT ON posthorn.settings TO posthorn_definer;
GRANT SELECT (key, created_at), DELETE ON idempotency_keys TO posthorn_definer;
-- posthorn.dead_letter: the parked record into dead_letters, its outbox
-- row rewritten into the skip marker, the park lifted, the decision in
-- console_audit (migration 00013).
-- (Its SELECT … FOR UPDATE of the park needs an UPDATE privilege on a
-- column of it; the function updates nothing there.)
GRANT SELECT, DELETE, UPDATE (reason) ON relay_parked TO posthorn_definer;
GRANT SELECT, UPDATE (type, headers, payload) ON outbox TO posthorn_definer;
GRANT SELECT ON outbox_pending TO posthorn_definer;
GRANT INSERT ON dead_letters, console_audit TO posthorn_definer;
GRANT USAGE ON SEQUENCE console_audit_id_seq TO posthorn_definer;
-- Hand the functions over. A role that is not a superuser may only give
-- a function to a role it is a member of (cluster.sql sees to that) which
-- may create in the function's schema; that right is taken back at once,
-- so the definer can never create anything there.
GRANT CREATE ON SCHEMA posthorn TO posthorn_definer;
ALTER FUNCTION posthorn.uuidv7() OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.shard(text) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.write(text, text, text, text, json, jsonb, bigint, text) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.prune_idempotency_keys(timestamptz, integer) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.dead_letter(text, text, uuid, text, text, boolean) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.raise_revision_floor() OWNER TO posthorn_definer;
REVOKE CREATE ON SCHEMA posthorn FROM posthorn_definer;

-- posthorn_relay: relay, outbox status/release/resend, replay.
GRANT SELECT ON outbox TO posthorn_relay;
GRANT SELECT, DELETE ON outbox_pending TO posthorn_relay;
GRANT SELECT ON relay_leases TO posthorn_relay;
GRANT UPDATE (owner, token, expires_at) ON relay_leases TO posthorn_relay;
GRANT USAGE ON SEQUENCE relay_fencing_token TO posthorn_relay;
GRANT SELECT, INSERT, UPDATE, DELETE ON relay_members TO posthorn_relay;
GRANT SELECT, INSERT, DELETE ON relay_parked TO posthorn_relay;
-- The read's low-water mark (migrations 00016, 00020): the relay reads the
-- last outbox id given out and the release generation, which a release (a
-- delete of a park, by the relay or posthorn.dead_letter) moves through
-- the trigger on relay_parked, whose function runs as posthorn_definer:
-- no role sets the generation itself.
GRANT SELECT ON SEQUENCE outbox_id_seq TO posthorn_relay;
GRANT SELECT ON relay_release TO posthorn_relay;
GRANT SELECT, UPDATE ON relay_release TO posthorn_definer;
-- outbox dead-letter (and the console's Dead-letter) goes through the
-- function only: the relay cannot rewrite an outbox row itself.
GRANT EXECUTE ON FUNCTION posthorn.dead_letter(text, text, uuid, text, text, boolean) TO posthorn_relay;
GRANT SELECT ON dead_letters TO posthorn_relay;
-- Replay selects by journal sequence and time; never the journal metadata.
GRANT SELECT (id, sequence, posted_at) ON journals TO posthorn_relay;
GRANT SELECT ON ops_archive_segments, ops_cleanup TO posthorn_relay;
GRANT SELECT, INSERT, UPDATE ON ops_replay_progress TO posthorn_relay;

-- posthorn_relay_cdc: the slot lease on top of posthorn_relay.
GRANT SELECT, INSERT, UPDATE ON relay_cdc_leases TO posthorn_relay_cdc;
GRANT SELECT ON relay_cdc_leases TO posthorn_relay;

-- posthorn_reconciler: read-only, plus the coverage it proves. The cut reads
-- outbox_id_seq's last_value (SELECT on the sequence, not USAGE); the
-- console's count of the backlog reads it and relay_release to keep its
-- marks (relaystore.Store.Status).
GRANT SELECT ON accounts, account_balances, account_revisions, journals, journal_lines, outbox, outbox_pending,
    relay_leases, relay_parked, ops_coverage, ops_archive_segments, ops_cleanup, dead_letters, relay_release
    TO posthorn_reconciler;
GRANT SELECT ON SEQUENCE outbox_id_seq, journal_sequence TO posthorn_reconciler;
GRANT INSERT, UPDATE ON ops_coverage TO posthorn_reconciler;
-- The operator console reads as the reconciler and records its actions in
-- console_audit: append and finish a row, never delete one. (Releasing a
-- relay-parked aggregate and resending also need posthorn_relay.)
GRANT SELECT, INSERT ON console_audit TO posthorn_reconciler;
GRANT UPDATE (outcome, detail, finished_at) ON console_audit TO posthorn_reconciler;
GRANT USAGE ON SEQUENCE console_audit_id_seq TO posthorn_reconciler;

-- posthorn_maintainer: archive (writes verified segments) and cleanup
-- (deletes outbox rows behind the boundary, records the floor).
GRANT SELECT (id, sequence, posted_at) ON journals TO posthorn_maintainer;
GRANT SELECT, DELETE ON outbox TO posthorn_maintainer;
GRANT SELECT ON outbox_pending TO posthorn_maintainer;
GRANT SELECT ON SEQUENCE outbox_id_seq TO posthorn_maintainer;
GRANT SELECT ON ops_coverage, relay_leases TO posthorn_maintainer;
-- failover recover reports the aggregates the relay parked.
GRANT SELECT ON relay_parked TO posthorn_maintainer;
GRANT SELECT, INSERT, UPDATE ON ops_archive_segments, ops_cleanup TO posthorn_maintainer;
-- `posthorn retention` as the maintainer: expired idempotency keys,
-- through the same function as the API.
GRANT EXECUTE ON FUNCTION posthorn.prune_idempotency_keys(timestamptz, integer) TO posthorn_maintainer;

-- posthorn failover check and recover (migrations 00012, 00015), run as
-- the maintainer: the check reads which events the ledger holds and where
-- its sequences and revisions stand; the recovery writes only through the
-- functions, which re-commit a lost posting from its published events
-- (posthorn.failover_rebuild, which checks the headers and calls
-- posthorn.failover_recommit: the maintainer may not call the latter
-- itself), move sequences and revisions forward, record what cannot be
-- rebuilt and the lost postings' idempotency digests, and accept the
-- server's own history.
REVOKE ALL ON TABLE posthorn.failover_lost
    FROM posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler, posthorn_maintainer, posthorn_consumer,
        posthorn_publisher, posthorn_definer;
GRANT SELECT (journal_id, account_id, revision) ON journal_lines TO posthorn_maintainer;
GRANT SELECT (id, revision) ON accounts TO posthorn_maintainer;
GRANT SELECT ON account_revisions TO posthorn_maintainer;
GRANT SELECT ON posthorn_aggregates, posthorn.ledger_timelines, posthorn.failover_lost, posthorn.failover_keys
    TO posthorn_maintainer;
GRANT SELECT ON SEQUENCE journal_sequence TO posthorn_maintainer;
GRANT EXECUTE ON FUNCTION posthorn.ledger_history(), posthorn.ledger_history_accepted(),
    posthorn.failover_rebuild(uuid, timestamptz, jsonb),
    posthorn.failover_advance(bigint, bigint, text[], text[], bigint[]),
    posthorn.failover_record_lost(uuid, text, text, bigint, uuid, text, text),
    posthorn.failover_record_key(text, uuid, boolean, text, timestamptz),
    posthorn.failover_accept(text) TO posthorn_maintainer;
-- What the functions write, as their owner.
GRANT SELECT, INSERT ON accounts, journals, journal_lines TO posthorn_definer;
GRANT UPDATE (revision) ON accounts TO posthorn_definer;
GRANT SELECT, INSERT ON account_opening_balances TO posthorn_definer;
GRANT UPDATE (balance_after) ON journal_lines TO posthorn_definer;
GRANT INSERT (journal_id) ON outbox TO posthorn_definer;
GRANT DELETE ON outbox_pending TO posthorn_definer;
GRANT SELECT, UPDATE ON SEQUENCE journal_sequence, outbox_id_seq TO posthorn_definer;
GRANT SELECT, INSERT ON posthorn.failover_lost, posthorn.failover_keys TO posthorn_definer;
GRANT SELECT, INSERT ON posthorn.ledger_timelines TO posthorn_definer;
GRANT EXECUTE ON FUNCTION posthorn.ledger_history(), posthorn.accept_ledger_history(text, text) TO posthorn_definer;
GRANT CREATE ON SCHEMA posthorn TO posthorn_definer;
ALTER FUNCTION posthorn.failover_recommit(uuid, timestamptz, jsonb) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.failover_rebuild(uuid, timestamptz, jsonb) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.failover_record_key(text, uuid, boolean, text, timestamptz) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.failover_advance(bigint, bigint, text[], text[], bigint[]) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.failover_record_lost(uuid, text, text, bigint, uuid, text, text) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.failover_accept(text) OWNER TO posthorn_definer;
ALTER FUNCTION posthorn.relay_parked_released() OWNER TO posthorn_definer;
REVOKE CREATE ON SCHEMA posthorn FROM posthorn_definer;
