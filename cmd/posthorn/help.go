package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// helpText is what `posthorn NAME --help` (and `posthorn help NAME`) says
// beyond the flag list: what the command does, and an example to copy.
type helpText struct {
	about   string
	example string
}

// commandHelp holds the help of every command in commands and of every
// command group (the first word of two-word commands); the help test
// fails for one without it.
var commandHelp = map[string]helpText{
	"api": {
		about:   "Serves the Posting API (POST /v1/postings, GET /v1/postings/{id}, GET /v1/accounts/{account}, /healthz, /readyz) on api.listen.\nWith api.tokens empty, authentication is off and the log says so at start. Stops cleanly on SIGINT or SIGTERM.",
		example: "posthorn api --database.url postgres://posthorn@127.0.0.1:5432/ledger --api.listen 127.0.0.1:8080",
	},
	"archive": {
		about:   "Writes covered outbox rows (relayed, and below the verified coverage boundary) to archive segments in archive.dir,\nwith a manifest; --verify re-reads every segment and checks it against the ledger's record without writing.",
		example: "posthorn archive --database.url postgres://posthorn@127.0.0.1:5432/ledger --archive.dir /var/lib/posthorn/archive",
	},
	"cleanup": {
		about:   "Deletes outbox rows below the verified boundary: relayed, covered by every required consumer, archived, and older\nthan cleanup.replay_window. Run with --dry-run first to see what would go.",
		example: "posthorn cleanup --dry-run --database.url postgres://posthorn@127.0.0.1:5432/ledger --archive.dir /var/lib/posthorn/archive",
	},
	"config": {
		about:   "Configuration commands. The configuration is merged from the embedded defaults, the YAML file (--config), the\nenvironment (POSTHORN_ + upper-case key, __ between levels) and flags named by key, each above the one before.",
		example: "posthorn config print --config configs/posthorn.example.yaml",
	},
	"config print": {
		about:   "Prints the effective configuration as YAML, every key with its value after defaults, file, environment and flags,\nsecrets redacted.",
		example: "POSTHORN_RELAY__BATCH_SIZE=100 posthorn config print --config posthorn.yaml",
	},
	"console": {
		about:   "Serves the operator console on console.listen: the data path, plots, parked aggregates and coverage.\nActions (release, resend, …) need console.token.",
		example: "posthorn console --database.url postgres://posthorn@127.0.0.1:5432/ledger --listen 127.0.0.1:8090",
	},
	"consume": {
		about:   "Runs the example consumers balance-projection and audit-log against the configured sink, each with its inbox\n(exactly once in effect, revision-gap checks), until SIGINT or SIGTERM. Needs `posthorn migrate --consumer` first.",
		example: "posthorn consume --consumer.database.url postgres://posthorn@127.0.0.1:5432/consumers --sink.kafka.brokers 127.0.0.1:9092",
	},
	"consume baseline": {
		about:   "Starts the balance projection at a cut of the ledger: it copies the ledger's balances and revisions at the cut,\nso the projection applies only later revisions.",
		example: "posthorn consume baseline --database.url postgres://posthorn@127.0.0.1:5432/ledger --consumer.database.url postgres://posthorn@127.0.0.1:5432/consumers",
	},
	"consume release": {
		about:   "Lifts a consumer's park of one account, so its held events re-drive in revision order.",
		example: "posthorn consume release --consumer balance-projection --account acc-bob",
	},
	"consume status": {
		about:   "Prints dispositions (applied, duplicate, parked, rejected), duplicates absorbed and parked accounts per consumer.",
		example: "posthorn consume status --json --consumer.database.url postgres://posthorn@127.0.0.1:5432/consumers",
	},
	"demo": {
		about:   "Runs everything in one process on embedded defaults: a throwaway PostgreSQL (when database.url is unset), an\nin-process Kafka-protocol broker, the API, the relay and the example consumers; posts random transfers while\nrestarting the relay and the consumers, waits for delivery, reconciles and prints a summary. Exits non-zero on any\nmismatch. It refuses a database that already holds postings.",
		example: "posthorn demo --postings 2000 --json",
	},
	"dev": {
		about:   "Tools for local work.",
		example: "posthorn dev kafka --listen 127.0.0.1:9092 --data-dir /tmp/posthorn-kafka",
	},
	"dev kafka": {
		about:   "Runs a standalone Kafka-protocol broker (kfake) for local work and prints a ready line on stdout. With --nodes N\nit is a cluster of N brokers on consecutive ports; each SIGUSR1 moves the partition leaders.",
		example: "posthorn dev kafka --listen 127.0.0.1:9092 --data-dir /tmp/posthorn-kafka",
	},
	"migrate": {
		about:   "Creates or upgrades the ledger schema on database.url (with --consumer, the example consumers' schema on\nconsumer.database.url; with --roles, the per-component database roles). Idempotent; says which migrations it applied.",
		example: "posthorn migrate --database.url postgres://postgres@127.0.0.1:5432/ledger --roles",
	},
	"failover": {
		about:   "After the ledger failed over to a standby that missed the last postings: reads what the consumers saw (their inboxes,\nand the audit log's table, which keeps every event whole) against the new primary, names every lost event, and recovers.",
		example: "posthorn failover check --database.url postgres://posthorn_maintainer@ledger-b:5432/ledger",
	},
	"failover check": {
		about:   "Reads every configured consumer's inbox (reconcile.consumers, or the two example consumers on consumer.database.url)\nand the audit log's table against the ledger, and names every event the world saw that the ledger lacks: ID, journal,\naccount, revision, amount (where a source kept the payload), and whether a recovery can re-commit it. Writes nothing.\nExit 0 clean (nothing lost, revisions ahead of what was seen, history accepted), 1 something to recover, 2 could not run.",
		example: "posthorn failover check --json",
	},
	"failover recover": {
		about:   "Does what failover check names, in one transaction: re-commits every lost posting that its published events rebuild\nwhole, with its journal ID, event IDs and revisions (its outbox rows marked relayed: consumers have them); moves the\noutbox ids, the journal sequence and every aggregate's revision past what was published; records the lost events it\ncannot rebuild; accepts the ledger's history, so the relay resumes. --dry-run writes nothing (exit as check). A second\nrun finds nothing to do. Exit 0 recovered or nothing to do, 2 could not run.",
		example: "posthorn failover recover --dry-run",
	},
	"outbox": {
		about:   "Inspect and act on the outbox: the backlog, leases, parked aggregates and uncertain rows; release a parked\naggregate; resend rows with their original event IDs.",
		example: "posthorn outbox status --database.url postgres://posthorn@127.0.0.1:5432/ledger",
	},
	"outbox release": {
		about:   "Lets the relay send a parked aggregate again, from the record that was parked: an account (--account), a command\njournal (--journal), or any aggregate type (--aggregate-type with --aggregate-id).",
		example: "posthorn outbox release --aggregate-type wallet --aggregate-id w-42",
	},
	"outbox dead-letter": {
		about:   "For a record the sink can never take (too large, refused for good): moves the record the relay parked to the\nledger database's dead_letters table, puts a skip marker (type posthorn.dead_lettered, same event ID and revision)\nin its place and lifts the park, so the aggregate's later events flow; consumers record the marker as skipped. The\ndecision is in the audit log (console_audit) with --operator.",
		example: "posthorn outbox dead-letter --aggregate-type wallet --aggregate-id w-42 --operator alice",
	},
	"outbox resend": {
		about:   "Sends outbox rows again through the configured sink with their original event IDs (consumers' inboxes absorb the\nrepeats); an unrelayed row gets its marker after the ACK.",
		example: "posthorn outbox resend --from-id 1200 --to-id 1250 --sink.kafka.brokers 127.0.0.1:9092",
	},
	"outbox status": {
		about:   "Prints the backlog, the oldest unrelayed age, the shards' leases, parked aggregates, uncertain rows and, in CDC mode,\nthe replication slot. Aggregate IDs and reasons are printed quoted when they hold control characters.",
		example: "posthorn outbox status --json --database.url postgres://posthorn@127.0.0.1:5432/ledger",
	},
	"reconcile": {
		about:   "Matches journals, outbox rows and every configured consumer's dispositions up to a cut, and reports what is missing,\nunrelayed, unproven, duplicated or unknown. Exit 0 clean (the coverage boundary is recorded), 1 discrepancies,\n2 could not run.",
		example: "posthorn reconcile --cut 1200 --json",
	},
	"relay": {
		about:   "Runs the bridge: claims shard leases, reads the outbox in batches, publishes to the sink, writes the marker after\nthe broker's ACK. SIGINT or SIGTERM stops it softly (finishes the batch, releases the leases). With metrics.listen\nset it serves /metrics, /healthz and /readyz (ready when the database and the sink answer).",
		example: "posthorn relay --database.url postgres://posthorn@127.0.0.1:5432/ledger --sink.kafka.brokers 127.0.0.1:9092 --metrics.listen 127.0.0.1:9464",
	},
	"replay": {
		about:   "Replays historical events for a range (journal sequences, times, one account) with their original event IDs and the\nreplay header, to the original topic or another (--topic). Commands only with --include-commands.",
		example: "posthorn replay --from-sequence 1 --to-sequence 500 --topic ledger.events.replay-projection",
	},
	"retention": {
		about:   "Prunes final consumer inbox rows behind the safe horizon and expired idempotency keys, in small batches.",
		example: "posthorn retention --only idempotency-keys --json",
	},
	"version": {
		about:   "Prints the version and build information (also: posthorn --version).",
		example: "posthorn version",
	},
}

// keyFlagsNote ends every command's help: the keys not listed are flags
// all the same.
const keyFlagsNote = `Every configuration key is also a flag named by the key, typed by its default: --relay.batch_size 100,
--relay.poll_interval 2s, --sink.kafka.brokers a:9092,b:9092. Precedence: defaults < --config file <
environment (POSTHORN_RELAY__BATCH_SIZE) < flags. ` + "`posthorn config print`" + ` lists every key;
docs/configuration.md says what each means.`

// printCommandHelp writes the help of the command name with its flag list.
func printCommandHelp(w io.Writer, name, flags string) {
	h := commandHelp[name]
	fmt.Fprintf(w, "Usage: posthorn %s [flags]\n\n%s\n", name, h.about)
	if subs := subcommands(name); len(subs) > 0 {
		fmt.Fprintln(w, "\nCommands:")
		printCommandList(w, subs)
	}
	fmt.Fprintf(w, "\nFlags:\n%s\n%s\n\nExample:\n  %s\n", flags, keyFlagsNote, h.example)
}

// printGroupHelp writes the help of a command group (outbox, config, dev).
func printGroupHelp(w io.Writer, group string) {
	h := commandHelp[group]
	fmt.Fprintf(w, "Usage: posthorn %s COMMAND [flags]\n\n%s\n\nCommands:\n", group, h.about)
	printCommandList(w, subcommands(group))
	fmt.Fprintf(w, "\nRun `posthorn %s COMMAND --help` for a command's flags.\n\nExample:\n  %s\n", group, h.example)
}

// subcommands lists the commands under name ("outbox" → "outbox status",
// …), sorted.
func subcommands(name string) []string {
	var out []string
	for n := range commands {
		if strings.HasPrefix(n, name+" ") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// isGroup reports whether name is the first word of two-word commands
// without being a command itself (consume is both).
func isGroup(name string) bool {
	_, isCmd := commands[name]
	return !isCmd && len(subcommands(name)) > 0
}

func printCommandList(w io.Writer, names []string) {
	for _, n := range names {
		fmt.Fprintf(w, "  %-17s %s\n", n, commands[n].summary)
	}
}

// usage is the command list of a bare `posthorn` or `posthorn --help`.
func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: posthorn COMMAND [--config FILE] [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	printCommandList(w, names)
	fmt.Fprintln(w, "\nRun `posthorn COMMAND --help` (or `posthorn help COMMAND`) for what a command does, its flags and an example.\n`posthorn --version` prints the version.")
}
