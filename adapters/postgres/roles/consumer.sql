-- Privileges on the CONSUMER database (run in it after the consumer
-- migrations; re-runnable, revoke-then-grant like ledger.sql).
--   posthorn_consumer    its inbox, positions and the example projections;
--                        nothing in the ledger database.
--   posthorn_reconciler  reads the dispositions (consumer_inbox), the
--                        positions, the retention horizon and the
--                        projection's balances (its balance view).

REVOKE ALL ON TABLE consumer_inbox, consumer_positions, consumer_retention, projection_balances, audit_log,
    posthorn_consumer_migrations
    FROM posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler, posthorn_maintainer, posthorn_consumer;

GRANT USAGE ON SCHEMA public TO posthorn_consumer, posthorn_reconciler;

GRANT SELECT, INSERT, UPDATE ON consumer_inbox, consumer_positions, projection_balances, audit_log TO posthorn_consumer;
GRANT SELECT ON consumer_inbox TO posthorn_reconciler;
-- The projection's balances are its balance view, which reconciliation
-- holds against the ledger's journal.
GRANT SELECT ON projection_balances TO posthorn_reconciler;
-- The inbox's protocol in SQL for consumers outside Go (migrations 00003,
-- 00004, 00006: posthorn_inbox_receive calls 00004's posthorn_inbox_rule);
-- it runs with the caller's rights, the ones above.
GRANT EXECUTE ON FUNCTION posthorn_inbox_receive(text, jsonb, boolean), posthorn_inbox_rule(text, jsonb, boolean) TO posthorn_consumer;
-- Inbox retention (`posthorn retention`, and on a schedule inside
-- `posthorn consume`): the consumer deletes its own final inbox rows behind
-- the horizon and records it; the reconciler reads the horizon and the
-- positions to tell a pruned disposition from a missing one.
GRANT DELETE ON consumer_inbox TO posthorn_consumer;
GRANT SELECT, INSERT, UPDATE ON consumer_retention TO posthorn_consumer;
GRANT SELECT ON consumer_retention, consumer_positions TO posthorn_reconciler;
