-- Privileges on the CONSUMER database (run in it after the consumer schema
-- and the example consumers' tables are migrated; re-runnable,
-- revoke-then-grant like ledger.sql).
--   posthorn_consumer    the inbox's tables and functions, but only the rows
--                        of consumers whose role the caller is a member of
--                        (row-level security below); nothing in the ledger
--                        database.
--   posthorn_consumer_<name>
--                        one per row of consumer_identities, a member of
--                        posthorn_consumer: the identity of one consumer,
--                        and the example consumers' effect tables
--                        (projection_balances for balance-projection,
--                        audit_log for audit-log). A login that runs
--                        several consumers is a member of each one's role.
--   posthorn_reconciler  reads the dispositions (consumer_inbox), the
--                        positions, the retention horizon and the
--                        projection's balances (its balance view); writes
--                        only the marks of its clean passes
--                        (consumer_reconciled).

-- One role per registered consumer. Roles are cluster-wide: another
-- database's run may have created it, or be creating it now.
DO $identities$
DECLARE
    r name;
BEGIN
    FOR r IN SELECT role FROM consumer_identities ORDER BY role LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
        IF NOT pg_has_role(r, 'posthorn_consumer', 'MEMBER') THEN
            EXECUTE format('GRANT posthorn_consumer TO %I', r);
        END IF;
        EXECUTE format('REVOKE ALL ON TABLE consumer_inbox, consumer_positions, consumer_retention, consumer_identities, '
                       'consumer_reconciled, projection_balances, audit_log, posthorn_consumer_migrations, '
                       'posthorn_consumer_balance_projection_migrations, posthorn_consumer_audit_log_migrations FROM %I', r);
    END LOOP;
END
$identities$;

REVOKE ALL ON TABLE consumer_inbox, consumer_positions, consumer_retention, consumer_identities, consumer_reconciled,
    projection_balances, audit_log,
    posthorn_consumer_migrations, posthorn_consumer_balance_projection_migrations, posthorn_consumer_audit_log_migrations
    FROM posthorn_api, posthorn_relay, posthorn_relay_cdc, posthorn_reconciler, posthorn_maintainer, posthorn_consumer;

GRANT USAGE ON SCHEMA public TO posthorn_consumer, posthorn_reconciler;

-- The inbox's tables, row by row as the policies below allow. Retention
-- (`posthorn retention`, and on a schedule inside `posthorn consume`)
-- deletes a consumer's final inbox rows behind the horizon and records it.
GRANT SELECT, INSERT, UPDATE, DELETE ON consumer_inbox TO posthorn_consumer;
GRANT SELECT, INSERT, UPDATE ON consumer_positions, consumer_retention TO posthorn_consumer;
-- The policies read the mapping as the caller.
GRANT SELECT ON consumer_identities TO posthorn_consumer, posthorn_reconciler;
-- The example consumers' effects, each to its own consumer's role only.
GRANT SELECT, INSERT, UPDATE ON projection_balances TO posthorn_consumer_balance_projection;
GRANT SELECT, INSERT, UPDATE ON audit_log TO posthorn_consumer_audit_log;

-- A row belongs to the consumer it names; a caller may see and write it
-- only as a member of that consumer's role. The policy's table and
-- function references are bound when it is created, so a caller's own
-- objects (a temporary consumer_identities, a function in public) cannot
-- stand in for them. The subquery does not depend on the row: it runs
-- once per statement. The tables' owner (the migrations' role) is not
-- subject to the policies.
ALTER TABLE consumer_inbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE consumer_positions ENABLE ROW LEVEL SECURITY;
ALTER TABLE consumer_retention ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumer_own_rows ON consumer_inbox;
DROP POLICY IF EXISTS consumer_own_rows ON consumer_positions;
DROP POLICY IF EXISTS consumer_own_rows ON consumer_retention;
DROP POLICY IF EXISTS reconciler_reads ON consumer_inbox;
DROP POLICY IF EXISTS reconciler_reads ON consumer_positions;
DROP POLICY IF EXISTS reconciler_reads ON consumer_retention;
CREATE POLICY consumer_own_rows ON consumer_inbox TO posthorn_consumer
    USING (consumer IN (SELECT i.consumer FROM consumer_identities i JOIN pg_roles r ON r.rolname = i.role
                        WHERE pg_has_role(r.oid, 'MEMBER')))
    WITH CHECK (consumer IN (SELECT i.consumer FROM consumer_identities i JOIN pg_roles r ON r.rolname = i.role
                             WHERE pg_has_role(r.oid, 'MEMBER')));
CREATE POLICY consumer_own_rows ON consumer_positions TO posthorn_consumer
    USING (consumer IN (SELECT i.consumer FROM consumer_identities i JOIN pg_roles r ON r.rolname = i.role
                        WHERE pg_has_role(r.oid, 'MEMBER')))
    WITH CHECK (consumer IN (SELECT i.consumer FROM consumer_identities i JOIN pg_roles r ON r.rolname = i.role
                             WHERE pg_has_role(r.oid, 'MEMBER')));
CREATE POLICY consumer_own_rows ON consumer_retention TO posthorn_consumer
    USING (consumer IN (SELECT i.consumer FROM consumer_identities i JOIN pg_roles r ON r.rolname = i.role
                        WHERE pg_has_role(r.oid, 'MEMBER')))
    WITH CHECK (consumer IN (SELECT i.consumer FROM consumer_identities i JOIN pg_roles r ON r.rolname = i.role
                             WHERE pg_has_role(r.oid, 'MEMBER')));
-- Reconciliation reads every consumer's rows.
CREATE POLICY reconciler_reads ON consumer_inbox FOR SELECT TO posthorn_reconciler USING (true);
CREATE POLICY reconciler_reads ON consumer_positions FOR SELECT TO posthorn_reconciler USING (true);
CREATE POLICY reconciler_reads ON consumer_retention FOR SELECT TO posthorn_reconciler USING (true);
GRANT SELECT ON consumer_inbox TO posthorn_reconciler;
-- The projection's balances are its balance view, which reconciliation
-- holds against the ledger's journal.
GRANT SELECT ON projection_balances TO posthorn_reconciler;
GRANT SELECT ON consumer_retention, consumer_positions TO posthorn_reconciler;
-- Where its next pass starts (migration 00009). No consumer may move it:
-- a mark moved past a row hides that row from the next pass.
GRANT SELECT, INSERT, UPDATE ON consumer_reconciled TO posthorn_reconciler;
-- The inbox's protocol in SQL for consumers outside Go (migrations 00003,
-- 00004, 00006: posthorn_inbox_receive calls 00004's posthorn_inbox_rule);
-- it runs with the caller's rights, the ones above, so the policies hold
-- there too.
GRANT EXECUTE ON FUNCTION posthorn_inbox_receive(text, jsonb, boolean), posthorn_inbox_rule(text, jsonb, boolean) TO posthorn_consumer;
