package main

import (
	"context"
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
	p, err := fs.start(ctx, args, needs{})
	if err != nil {
		return err
	}
	cfg := p.cfg
	if *consumer {
		if err := cfg.RequireConsumerDatabase(); err != nil {
			return err
		}
		applied, err := postgres.Upgrade(ctx, cfg.Consumer.Database.URL, postgres.ConsumerSchema)
		if err != nil {
			return err
		}
		printApplied(postgres.ConsumerSchema, applied)
		if err := warnWritablePublic(ctx, p, cfg.Consumer.Database.URL); err != nil {
			return err
		}
		return migrateRoles(ctx, *roles, *logins, cfg.Consumer.Database.URL, postgres.ConsumerSchema)
	}
	if err := cfg.RequireDatabase(); err != nil {
		return err
	}
	applied, err := postgres.Upgrade(ctx, cfg.Database.URL, postgres.LedgerSchema)
	if err != nil {
		return err
	}
	printApplied(postgres.LedgerSchema, applied)
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
	return migrateRoles(ctx, *roles, *logins, cfg.Database.URL, postgres.LedgerSchema)
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

// printApplied says what migrate did: the migrations it applied, or that
// there was nothing to apply.
func printApplied(schema postgres.Schema, applied []string) {
	if len(applied) == 0 {
		fmt.Printf("%s schema is up to date: no migration to apply\n", schema)
		return
	}
	fmt.Printf("%s schema: applied %d migration(s): %s\n", schema, len(applied), strings.Join(applied, ", "))
}

// migrateRoles applies the per-component roles to schema (--roles) and,
// with --create-logins, a LOGIN role per component of that schema. The
// passwords come from the environment only, never from flags (which show
// in ps); they reach the server as SCRAM verifiers.
func migrateRoles(ctx context.Context, roles, logins bool, dsn string, schema postgres.Schema) error {
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
	groups := []postgres.Role{postgres.RoleAPI, postgres.RoleRelay, postgres.RoleRelayCDC, postgres.RoleReconciler, postgres.RoleMaintainer}
	if schema == postgres.ConsumerSchema {
		groups = []postgres.Role{postgres.RoleConsumer}
	}
	pool, err := postgres.Connect(ctx, dsn, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, g := range groups {
		component := strings.TrimPrefix(string(g), "posthorn_")
		env := "POSTHORN_ROLE_PASSWORD_" + strings.ToUpper(component)
		login := string(g) + "_login"
		if err := postgres.CreateLogin(ctx, pool, login, os.Getenv(env), g); err != nil {
			return err
		}
		how := "with the password from " + env
		if os.Getenv(env) == "" {
			how = "without a password (" + env + " unset: trust, peer or cert authentication only)"
		}
		fmt.Printf("login role %s (member of %s) %s\n", login, g, how)
	}
	return nil
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
