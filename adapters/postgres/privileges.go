package postgres

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/core"
)

// Role is one of Posthorn's per-component group roles (NOLOGIN). What each
// may do is written, and explained, in roles/ledger.sql and
// roles/consumer.sql; ApplyRoles creates them and grants exactly that.
type Role string

const (
	// RoleAPI writes postings: the ledger and the outbox, never the relay's
	// marker, and deletes nothing.
	RoleAPI Role = "posthorn_api"
	// RoleRelay reads the outbox and writes only its marker, leases,
	// members and parked aggregates; no journal lines, no balances.
	RoleRelay Role = "posthorn_relay"
	// RoleRelayCDC is RoleRelay plus the slot lease; its LOGIN role also
	// needs the REPLICATION attribute, which membership cannot pass on.
	RoleRelayCDC Role = "posthorn_relay_cdc"
	// RoleReconciler reads the ledger, the outbox and the consumers'
	// dispositions and writes only the verified coverage.
	RoleReconciler Role = "posthorn_reconciler"
	// RoleMaintainer archives and cleans up: the only role that may delete
	// outbox rows.
	RoleMaintainer Role = "posthorn_maintainer"
	// RoleConsumer may use the inbox's tables and functions in the
	// consumer database, only for the consumers whose role (ConsumerRole)
	// it is also a member of, and nothing in the ledger's.
	RoleConsumer Role = "posthorn_consumer"
	// RolePublisher is the group a team's service joins to publish events
	// and commands (posthorn_publish, posthorn_send_command, the publish
	// package): EXECUTE on those functions and no table at all.
	RolePublisher Role = "posthorn_publisher"
	// RoleDefiner owns the SECURITY DEFINER functions of the schema
	// posthorn and holds only what they do; nobody logs in as it.
	RoleDefiner Role = "posthorn_definer"
)

// Roles lists every group role ApplyRoles creates.
var Roles = []Role{RoleAPI, RoleRelay, RoleRelayCDC, RoleReconciler, RoleMaintainer, RoleConsumer, RolePublisher, RoleDefiner}

//go:embed roles/*.sql
var roleSQL embed.FS

// RolesSQL returns the SQL ApplyRoles runs for schema: the cluster-wide
// role creation followed by the grants on that schema's tables, for
// operators who apply it by hand (psql -f) instead.
func RolesSQL(schema Schema) (cluster, grants string, err error) {
	c, err := roleSQL.ReadFile("roles/cluster.sql")
	if err != nil {
		return "", "", err
	}
	g, err := roleSQL.ReadFile("roles/" + string(schema) + ".sql")
	if err != nil {
		return "", "", fmt.Errorf("roles for %s: %w", schema, err)
	}
	return string(c), string(g), nil
}

// ApplyRoles creates the group roles (once per cluster) and grants their
// privileges on schema's tables in the database at dsn, which must already
// be migrated. It is idempotent: each run revokes what the roles hold on
// those tables and grants the current set, so it is run again after every
// upgrade. The connecting role needs CREATEROLE (or superuser) and must own
// the tables, i.e. be the role that ran the migrations.
func ApplyRoles(ctx context.Context, dsn string, schema Schema) error {
	cluster, grants, err := RolesSQL(schema)
	if err != nil {
		return err
	}
	conn, err := connectOnce(ctx, dsn, "roles")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Runs against other databases of the cluster are not serialised by an
	// advisory lock (those are per database) and may race on the shared
	// catalog; a re-run after such an error finds the work done.
	for attempt := 0; ; attempt++ {
		_, err = conn.Exec(ctx, cluster)
		if err == nil || attempt == 5 || !isCatalogRace(err) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(10*(attempt+1)) * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("roles: create group roles: %w", err)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// One run per database at a time: concurrent GRANTs on one table
		// fail with "tuple concurrently updated".
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockID(schema)+0x100); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, grants)
		return err
	})
	if err != nil {
		return fmt.Errorf("roles: grant on the %s schema (run posthorn migrate%s first, as the tables' owner): %w", schema, migrateFlag(schema), err)
	}
	return nil
}

func migrateFlag(s Schema) string {
	if s == ConsumerSchema {
		return " --consumer"
	}
	return ""
}

// isCatalogRace reports the errors two concurrent role creations or grants
// raise: duplicate role, unique violation on pg_authid, "tuple concurrently
// updated" (XX000), serialization failure.
func isCatalogRace(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "42710", "23505", "XX000", "40001", "40P01":
		return true
	}
	return false
}

// ErrBadRoleName is returned for a LOGIN role name that is not a plain
// lower-case SQL identifier.
var ErrBadRoleName = errors.New("role name must match ^[a-z_][a-z0-9_]{0,62}$")

// CreateLogin creates (or updates) the LOGIN role name as a member of each
// of groups (a login that runs several consumers needs each one's role),
// with password unless it is empty (then the role can only log in where
// pg_hba.conf does not ask for one: trust, peer, cert). The password never
// reaches the server in clear: it is sent as a SCRAM-SHA-256 verifier
// computed here, so statement logging on the server cannot reveal it.
// conn must be a role with CREATEROLE.
func CreateLogin(ctx context.Context, conn Execer, name, password string, groups ...Role) error {
	if !core.IsIdentifier(name) {
		return fmt.Errorf("login role %q: %w", name, ErrBadRoleName)
	}
	ident := pgx.Identifier{name}.Sanitize()
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("login role %s: %w", name, err)
	}
	stmt := "CREATE ROLE " + ident + " LOGIN"
	if exists {
		stmt = "ALTER ROLE " + ident + " LOGIN"
	}
	if password != "" {
		v, err := SCRAMVerifier(password)
		if err != nil {
			return fmt.Errorf("login role %s: %w", name, err)
		}
		// The verifier is base64, digits, '$' and ':' only: safe in quotes.
		stmt += " PASSWORD '" + v + "'"
	}
	if _, err := conn.Exec(ctx, stmt); err != nil && !isCatalogRace(err) {
		return fmt.Errorf("login role %s: %w", name, err)
	}
	for _, g := range groups {
		if _, err := conn.Exec(ctx, "GRANT "+pgx.Identifier{string(g)}.Sanitize()+" TO "+ident); err != nil {
			return fmt.Errorf("login role %s: grant %s: %w", name, g, err)
		}
	}
	return nil
}

// Execer is what CreateLogin needs: *pgx.Conn, *pgxpool.Pool and pgx.Tx
// all have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// scramIterations is PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// SCRAMVerifier returns the SCRAM-SHA-256 verifier PostgreSQL stores for
// password (RFC 5802/7677, PostgreSQL's "SCRAM-SHA-256$iter:salt$StoredKey:ServerKey"),
// with a random salt. The password is used as given (PostgreSQL applies
// SASLprep, which leaves ASCII passwords unchanged).
func SCRAMVerifier(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	return scramVerifier(password, salt, scramIterations)
}

func scramVerifier(password string, salt []byte, iterations int) (string, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", err
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac(salted, "Client Key"))
	server := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return "SCRAM-SHA-256$" + strconv.Itoa(iterations) + ":" + b64(salt) + "$" + b64(stored[:]) + ":" + b64(server), nil
}

// Privileges is what a connection's role may do beyond its grants.
type Privileges struct {
	Role        string
	Superuser   bool
	BypassRLS   bool
	Replication bool
	CreateRole  bool
}

// Elevated reports attributes no running component needs (REPLICATION is
// needed by the CDC relay only, and is not counted here).
func (p Privileges) Elevated() bool { return p.Superuser || p.BypassRLS || p.CreateRole }

// CurrentPrivileges reads the attributes of the pool's role.
func CurrentPrivileges(ctx context.Context, pool *pgxpool.Pool) (Privileges, error) {
	var p Privileges
	err := pool.QueryRow(ctx, `SELECT current_user, rolsuper, rolbypassrls, rolreplication, rolcreaterole
FROM pg_roles WHERE rolname = current_user`).Scan(&p.Role, &p.Superuser, &p.BypassRLS, &p.Replication, &p.CreateRole)
	if err != nil {
		return p, fmt.Errorf("read the database role's attributes: %w", err)
	}
	return p, nil
}

// WarnIfSuperuser logs a warning when the pool's role is a superuser (or
// may bypass row security or create roles): such a component could change
// or delete anything, so a bug or a stolen credential is not contained. It
// names the group role the component should run under. A failure to read
// the attributes is logged, not returned: the check must never stop a
// component that works.
func WarnIfSuperuser(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, component string, want Role) {
	p, err := CurrentPrivileges(ctx, pool)
	if err != nil {
		log.Warn("could not check the database role's privileges", "component", component, "err", err)
		return
	}
	if !p.Elevated() {
		return
	}
	log.Warn("DATABASE ROLE HAS MORE PRIVILEGES THAN THIS COMPONENT NEEDS: it can change or delete anything in the database; run it as a LOGIN role that is a member of its group role (posthorn migrate --roles)",
		"component", component, "role", p.Role, "superuser", p.Superuser, "bypassrls", p.BypassRLS,
		"createrole", p.CreateRole, "want_member_of", string(want))
}

// ComponentLogins applies the roles to the ledger database at ledgerURL and
// the consumer database at consumerURL, creates passwordless LOGIN roles
// <prefix>_api, <prefix>_relay and <prefix>_consumer (a member of the role
// of each of consumers, which must be registered) and returns the URLs that
// connect as them. It is for clusters that trust local connections and are
// thrown away (the demo); production logins get passwords (posthorn
// migrate --roles --create-logins) or certificates. Both URLs must be
// postgres:// URLs of the tables' owner.
func ComponentLogins(ctx context.Context, ledgerURL, consumerURL, prefix string, consumers []string) (api, relay, consumer string, err error) {
	if err := ApplyRoles(ctx, ledgerURL, LedgerSchema); err != nil {
		return "", "", "", err
	}
	if err := ApplyRoles(ctx, consumerURL, ConsumerSchema); err != nil {
		return "", "", "", err
	}
	consumerRoles := make([]Role, len(consumers))
	for i, n := range consumers {
		if consumerRoles[i], err = ConsumerRole(n); err != nil {
			return "", "", "", err
		}
	}
	conn, err := connectOnce(ctx, ledgerURL, "roles")
	if err != nil {
		return "", "", "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	urls := make([]string, 3)
	for i, c := range []struct {
		base      string
		component string
		groups    []Role
	}{{ledgerURL, "api", []Role{RoleAPI}}, {ledgerURL, "relay", []Role{RoleRelay}}, {consumerURL, "consumer", consumerRoles}} {
		name := prefix + "_" + c.component
		if err := CreateLogin(ctx, conn, name, "", c.groups...); err != nil {
			return "", "", "", err
		}
		u, err := url.Parse(c.base)
		if err != nil || u.Scheme == "" {
			return "", "", "", ErrBadDSN
		}
		u.User = url.User(name)
		urls[i] = u.String()
	}
	return urls[0], urls[1], urls[2], nil
}
