-- Posthorn's per-component group roles. Roles are cluster-wide: this part
-- runs once per cluster (re-running it changes nothing). The roles are
-- NOLOGIN groups; the people or programs that log in are LOGIN roles that
-- are members of one group (posthorn migrate --roles --create-logins, or an
-- operator's CREATE ROLE … LOGIN IN ROLE posthorn_api).
--
-- Role attributes (LOGIN, SUPERUSER, REPLICATION, …) are never inherited
-- through membership: the CDC relay's LOGIN role itself needs REPLICATION
-- (ALTER ROLE … REPLICATION), a group cannot pass it on.
--
-- Concurrent runs (several databases migrated at once) may race on the
-- catalog; the existence checks make a re-run a no-op, and the caller
-- retries the few errors such a race raises.
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['posthorn_api', 'posthorn_relay', 'posthorn_relay_cdc',
                             'posthorn_reconciler', 'posthorn_maintainer', 'posthorn_consumer',
                             'posthorn_publisher', 'posthorn_definer']
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created by a concurrent run
            END;
        END IF;
    END LOOP;
    -- The CDC relay does everything the polling relay does (catch-up from
    -- the outbox, markers), plus its slot lease.
    IF NOT pg_has_role('posthorn_relay_cdc', 'posthorn_relay', 'MEMBER') THEN
        GRANT posthorn_relay TO posthorn_relay_cdc;
    END IF;
    -- Services that were told to use posthorn_api for publishing keep
    -- working: the write role may publish too.
    IF NOT pg_has_role('posthorn_api', 'posthorn_publisher', 'MEMBER') THEN
        GRANT posthorn_publisher TO posthorn_api;
    END IF;
    -- posthorn_definer owns the SECURITY DEFINER functions (ledger.sql
    -- hands them over). A role that is not a superuser may give away what
    -- it owns only to a role it is a member of, and must stay one to
    -- replace those functions in a later migration.
    IF NOT pg_has_role(current_user, 'posthorn_definer', 'MEMBER') THEN
        GRANT posthorn_definer TO CURRENT_USER;
    END IF;
    -- pg_stat_activity hides xact_start (and the query) of other roles'
    -- sessions unless the reader holds pg_read_all_stats; without it the
    -- relay's held-by-open-transaction gauge would read zero while a
    -- posting transaction holds it back. The reconciler's in-flight check
    -- reads backend_xid, which every role sees: it gets no such grant.
    IF NOT pg_has_role('posthorn_relay', 'pg_read_all_stats', 'MEMBER') THEN
        GRANT pg_read_all_stats TO posthorn_relay;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles r ON r.oid = m.member
               WHERE g.rolname = 'pg_read_all_stats' AND r.rolname = 'posthorn_reconciler') THEN
        REVOKE pg_read_all_stats FROM posthorn_reconciler;
    END IF;
END
$roles$;
