package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/posthorn/posthorn/adapters/amqp"
	"github.com/posthorn/posthorn/adapters/kafka"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/redisstream"
	"github.com/posthorn/posthorn/adapters/sqlsink"
	"github.com/posthorn/posthorn/configs"
)

func runMigrate(ctx context.Context, args []string) error {
	fs := newFlags("migrate", "database.url", "consumer.database.url")
	consumer := fs.Bool("consumer", false, "migrate the example consumers' schema on consumer.database.url")
	roles := fs.Bool("roles", false, "also create the per-component group roles and grant their privileges on this schema (idempotent; see docs/security.md)")
	logins := fs.Bool("create-logins", false, "with --roles: also create a LOGIN role per component (posthorn_<component>_login), password from POSTHORN_ROLE_PASSWORD_<COMPONENT> when set")
	register := fs.String("register-consumer", "", "with --consumer --roles: comma-separated names of consumers (besides the examples) to give a role of their own, posthorn_consumer_<name>; only its members may write that consumer's inbox rows")
	p, err := fs.start(ctx, args, needs{})
	if err != nil {
		return err
	}
	cfg := p.cfg
	registered, err := consumerNamesFlag(*register, *consumer, *roles)
	if err != nil {
		return err
	}
	if *consumer {
		if err := cfg.RequireConsumerDatabase(); err != nil {
			return err
		}
		if err := migrateConsumerDatabase(ctx, cfg.Consumer.Database.URL, func(consumer string, applied []string) {
			if consumer == "" {
				printApplied(string(postgres.ConsumerSchema)+" schema", false, applied)
			} else {
				printApplied("the tables of "+consumer, true, applied)
			}
		}); err != nil {
			return err
		}
		if err := warnWritablePublic(ctx, p, cfg.Consumer.Database.URL); err != nil {
			return err
		}
		if len(registered) > 0 {
			granted, err := postgres.RegisterConsumers(ctx, cfg.Consumer.Database.URL, registered...)
			if err != nil {
				return fmt.Errorf("--register-consumer: %w", err)
			}
			for i, n := range registered {
				fmt.Printf("consumer %s answers as role %s\n", printable(n), granted[i])
			}
		}
		return migrateRoles(ctx, *roles, *logins, cfg.Consumer.Database.URL, postgres.ConsumerSchema, registered)
	}
	if err := cfg.RequireDatabase(); err != nil {
		return err
	}
	applied, err := postgres.Upgrade(ctx, cfg.Database.URL, postgres.LedgerSchema)
	if err != nil {
		return err
	}
	printApplied(string(postgres.LedgerSchema)+" schema", false, applied)
	// The SQL functions obey these, not their callers (docs/security.md).
	settings := postgres.Settings{CommandTopicPrefix: cfg.Sink.CommandTopicPrefix, IdempotencyKeyTTL: cfg.Retention.IdempotencyKeyTTL,
		MaxRecordBytes: sinkMaxRecordBytes(cfg.Sink)}
	if err := postgres.WriteSettings(ctx, cfg.Database.URL, settings); err != nil {
		return err
	}
	fmt.Printf("database settings: command topic prefix %q, idempotency keys kept at least %s, records of at most %d bytes (sink %s)\n",
		settings.CommandTopicPrefix, settings.IdempotencyKeyTTL, settings.MaxRecordBytes, cfg.Sink.Kind)
	if err := warnWritablePublic(ctx, p, cfg.Database.URL); err != nil {
		return err
	}
	return migrateRoles(ctx, *roles, *logins, cfg.Database.URL, postgres.LedgerSchema, nil)
}

// consumerNamesFlag splits --register-consumer; it needs --consumer and
// --roles, since the names become roles of the consumer database.
func consumerNamesFlag(v string, consumer, roles bool) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	if !consumer || !roles {
		return nil, errors.New("--register-consumer needs --consumer and --roles: it gives consumers of the consumer database roles of their own")
	}
	var names []string
	for _, n := range strings.Split(v, ",") {
		n = strings.TrimSpace(n)
		if _, err := postgres.ConsumerRole(n); err != nil {
			return nil, fmt.Errorf("--register-consumer: %w", err)
		}
		names = append(names, n)
	}
	return names, nil
}

// warnWritablePublic warns when roles other than its owner may create in
// the schema public of the database at dsn (PostgreSQL 14's default): such
// a role can shadow built-in functions for any code that looks in public.
func warnWritablePublic(ctx context.Context, p *prelude, dsn string) error {
	pool, err := postgres.Connect(ctx, dsn, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	creators, err := postgres.PublicSchemaCreators(ctx, pool)
	if err != nil {
		return err
	}
	if len(creators) > 0 {
		p.log.Warn("SCHEMA public IS WRITABLE BY ROLES OTHER THAN ITS OWNER: they can shadow built-in functions for code that looks there; Posthorn's definer functions do not, but revoke it unless something needs it: REVOKE CREATE ON SCHEMA public FROM PUBLIC (and from each role listed)",
			"may_create", strings.Join(creators, ","))
	}
	return nil
}

// printApplied says what migrate did to what (a schema, or a consumer's
// tables when plural): the migrations it applied, or that there was
// nothing to apply.
func printApplied(what string, plural bool, applied []string) {
	if len(applied) == 0 {
		verb := "is"
		if plural {
			verb = "are"
		}
		fmt.Printf("%s %s up to date: no migration to apply\n", what, verb)
		return
	}
	fmt.Printf("%s: applied %d migration(s): %s\n", what, len(applied), strings.Join(applied, ", "))
}

// migrateRoles applies the per-component roles to schema (--roles) and,
// with --create-logins, a LOGIN role per component of that schema: on the
// consumer database posthorn_consumer_login, a member of the example
// consumers' roles (what `posthorn consume` runs), and <role>_login for
// each consumer registered in this run. The passwords come from the
// environment only, never from flags (which show in ps); they reach the
// server as SCRAM verifiers.
func migrateRoles(ctx context.Context, roles, logins bool, dsn string, schema postgres.Schema, registered []string) error {
	if !roles {
		if logins {
			return fmt.Errorf("--create-logins needs --roles")
		}
		return nil
	}
	if err := postgres.ApplyRoles(ctx, dsn, schema); err != nil {
		return err
	}
	fmt.Printf("roles and grants on the %s schema are up to date\n", schema)
	if !logins {
		return nil
	}
	type login struct {
		component string
		groups    []postgres.Role
	}
	var want []login
	if schema == postgres.ConsumerSchema {
		examples, err := consumerRoles(exampleNames())
		if err != nil {
			return err
		}
		want = append(want, login{"consumer", examples})
		for _, n := range registered {
			r, err := postgres.ConsumerRole(n)
			if err != nil {
				return err
			}
			want = append(want, login{strings.TrimPrefix(string(r), "posthorn_"), []postgres.Role{r}})
		}
	} else {
		for _, g := range []postgres.Role{postgres.RoleAPI, postgres.RoleRelay, postgres.RoleRelayCDC, postgres.RoleReconciler, postgres.RoleMaintainer} {
			want = append(want, login{strings.TrimPrefix(string(g), "posthorn_"), []postgres.Role{g}})
		}
	}
	pool, err := postgres.Connect(ctx, dsn, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, l := range want {
		env := "POSTHORN_ROLE_PASSWORD_" + strings.ToUpper(l.component)
		name := "posthorn_" + l.component + "_login"
		if err := postgres.CreateLogin(ctx, pool, name, os.Getenv(env), l.groups...); err != nil {
			return err
		}
		how := "with the password from " + env
		if os.Getenv(env) == "" {
			how = "without a password (" + env + " unset: trust, peer or cert authentication only)"
		}
		fmt.Printf("login role %s (member of %s) %s\n", name, joinRoles(l.groups), how)
	}
	return nil
}

// consumerRoles maps consumer names to their roles (postgres.ConsumerRole).
func consumerRoles(names []string) ([]postgres.Role, error) {
	out := make([]postgres.Role, len(names))
	for i, n := range names {
		r, err := postgres.ConsumerRole(n)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

func joinRoles(rs []postgres.Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// sinkMaxRecordBytes is the largest record the sink of c carries, for
// posthorn.write's refusal at write time: Kafka's produce request, NATS's
// default max_payload, the others' max_payload_bytes (a payload limit, to
// which the 4096 bytes posthorn.write keeps for the envelope are added).
func sinkMaxRecordBytes(c configs.Sink) int64 {
	payload := func(configured, dflt int) int64 {
		if configured > 0 {
			return int64(configured) + postgres.MinRecordBytes
		}
		return int64(dflt) + postgres.MinRecordBytes
	}
	switch c.Kind {
	case "kafka":
		return kafka.MaxRecordBytes
	case "nats":
		return natsDefaultMaxPayload
	case "amqp":
		return payload(c.AMQP.MaxPayloadBytes, amqp.MaxPayloadBytesDefault)
	case "redis":
		return payload(c.Redis.MaxPayloadBytes, redisstream.MaxPayloadBytesDefault)
	case "postgres":
		return payload(c.Postgres.MaxPayloadBytes, sqlsink.MaxPayloadBytesDefault)
	}
	// The memory sink: an outbox payload (bytea) takes at most 1 GiB.
	return 1 << 30
}

// natsDefaultMaxPayload is a NATS server's default max_payload (1 MiB);
// the sink learns the server's own only once connected.
const natsDefaultMaxPayload = 1 << 20
