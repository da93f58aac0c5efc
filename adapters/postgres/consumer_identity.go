package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// consumerRolePrefix starts every consumer's own role; the rest of the
// name is the consumer's, with each character outside [a-z0-9] as '_'.
const consumerRolePrefix = "posthorn_consumer_"

// ErrBadConsumerName is returned for a consumer name that cannot name a
// role: empty, or longer than a role name allows.
var ErrBadConsumerName = errors.New("a consumer name is 1 to 45 characters")

// ConsumerRole is the group role that answers for the consumer name: only
// its members may write that consumer's inbox rows, positions and
// retention horizon (row-level security, roles/consumer.sql). Two names
// that map to one role cannot both be registered (RegisterConsumers).
func ConsumerRole(name string) (Role, error) {
	if name == "" || len(name) > 63-len(consumerRolePrefix) {
		return "", fmt.Errorf("consumer %q: %w", name, ErrBadConsumerName)
	}
	var b strings.Builder
	b.WriteString(consumerRolePrefix)
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return Role(b.String()), nil
}

// RegisterConsumers records each name's role in consumer_identities of the
// consumer database at dsn, all or none; ApplyRoles then creates the roles
// and their policies. A name already registered keeps its role; a name
// whose role another name holds is refused, naming both. The connecting
// role must own the tables (the one that ran the migrations).
func RegisterConsumers(ctx context.Context, dsn string, names ...string) ([]Role, error) {
	roles := make([]Role, len(names))
	for i, n := range names {
		r, err := ConsumerRole(n)
		if err != nil {
			return nil, err
		}
		roles[i] = r
	}
	conn, err := connectOnce(ctx, dsn, "register consumers")
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for i, n := range names {
			var holder string
			err := tx.QueryRow(ctx, `SELECT consumer FROM consumer_identities WHERE role = $1`, string(roles[i])).Scan(&holder)
			switch {
			case err == nil && holder != n:
				return fmt.Errorf("consumer %q: its role %s already answers for consumer %q; choose a name that differs in more than case and punctuation", n, roles[i], holder)
			case err == nil:
				continue
			case !errors.Is(err, pgx.ErrNoRows):
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO consumer_identities (consumer, role) VALUES ($1, $2)`, n, string(roles[i])); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "23505" {
					return fmt.Errorf("consumer %q: registered meanwhile with another role; run again", n)
				}
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("register consumers (run posthorn migrate --consumer first, as the tables' owner): %w", err)
	}
	return roles, nil
}

// CheckConsumerRoles returns an error naming each of consumers that the
// pool's role may not answer for (not registered, or not a member of its
// role), so that a consumer refuses to start instead of failing on its
// first event. The tables' owner and superusers, to whom row security does
// not apply, may answer for any.
func CheckConsumerRoles(ctx context.Context, pool *pgxpool.Pool, consumers []string) error {
	var exempt bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper OR pg_has_role(c.relowner, 'MEMBER')
FROM pg_roles, pg_class c WHERE rolname = current_user AND c.oid = 'consumer_inbox'::regclass`).Scan(&exempt); err != nil {
		return fmt.Errorf("check the consumers' roles: %w", err)
	}
	if exempt {
		return nil
	}
	var bad []string
	for _, n := range consumers {
		var role string
		var member bool
		err := pool.QueryRow(ctx, `SELECT i.role, COALESCE((SELECT pg_has_role(r.oid, 'MEMBER') FROM pg_roles r WHERE r.rolname = i.role), false)
FROM consumer_identities i WHERE i.consumer = $1`, n).Scan(&role, &member)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			bad = append(bad, fmt.Sprintf("consumer %q has no role: posthorn migrate --consumer --roles --register-consumer %s", n, n))
		case err != nil:
			return fmt.Errorf("check the consumers' roles: %w", err)
		case !member:
			bad = append(bad, fmt.Sprintf("consumer %q: this login is not a member of its role %s (GRANT %s TO <login>)", n, role, role))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("only members of a consumer's role may record its dispositions: %s", strings.Join(bad, "; "))
	}
	return nil
}
