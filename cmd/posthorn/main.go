package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
)

// command is one subcommand. run returns an error to print and exit 1, or an
// *exitError for another code.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands are the subcommands by name, each run by the function of its
// own file; two-word commands ("config print", "outbox status") are named
// with their space. It is filled in init: the commands' help reads it,
// and a package-level initialiser would make that a cycle.
var commands map[string]command

func init() {
	commands = map[string]command{
		"api":                {"serve the Posting API", runAPI},
		"archive":            {"write covered outbox rows to archive segments with a manifest (--verify re-reads and checks them)", runArchive},
		"cleanup":            {"delete outbox rows below the verified boundary (relayed, covered, archived, past the replay window); --dry-run first", runCleanup},
		"config print":       {"print the effective configuration, secrets redacted", runConfigPrint},
		"console":            {"serve the operator console: the data path, plots, parked aggregates, coverage; actions with console.token (--listen)", runConsole},
		"consume":            {"run the example consumers balance-projection and audit-log (--only NAME)", runConsume},
		"consume baseline":   {"start the balance projection at a cut of the ledger: its balances and positions, so it applies only later revisions (--json)", runBaseline},
		"consume release":    {"lift a consumer's park of one account so its events re-drive in order", runConsumeRelease},
		"consume status":     {"dispositions, duplicates and parked accounts per consumer (--json)", runConsumeStatus},
		"demo":               {"everything in one process on embedded defaults, with a summary at the end (--postings N, --json)", runDemo},
		"dev kafka":          {"a standalone Kafka-protocol broker for local work (kfake): --listen, --data-dir, --nodes; SIGUSR1 moves partition leaders", runDevKafka},
		"failover check":     {"name every event consumers saw that the ledger lacks after a failover, and what a recovery would do (--json); exit 0 clean, 1 lost events or history not accepted, 2 could not run", runFailoverCheck},
		"failover recover":   {"re-commit lost postings with their IDs, move sequences and revisions past what was published, accept the history (--dry-run first)", runFailoverRecover},
		"migrate":            {"create or upgrade the ledger schema (--consumer, --roles)", runMigrate},
		"outbox status":      {"backlog, oldest unrelayed age, leases, parked aggregates (--json)", runOutboxStatus},
		"outbox release":     {"let the relay send a parked aggregate again (--account ID, --journal ID, or --aggregate-type T --aggregate-id ID)", runOutboxRelease},
		"outbox dead-letter": {"move a record the sink can never take from a parked aggregate to dead_letters; a skip marker takes its place (--aggregate-type T --aggregate-id ID [--event-id E])", runOutboxDeadLetter},
		"outbox resend":      {"send rows again with the same event IDs (--event-id ID …, or --from-id/--to-id); marker after the ACK", runOutboxResend},
		"reconcile":          {"match journals, outbox and consumer dispositions up to a cut (--cut N, --json); exit 0 clean, 1 discrepancies, 2 could not run", runReconcile},
		"relay":              {"run the bridge: outbox → sink (SIGINT/SIGTERM stop it softly)", runRelay},
		"replay":             {"historical replay of events for a range (sequence, time, account) with the same event IDs and the replay header", runReplay},
		"retention":          {"prune final consumer inbox rows behind the safe horizon and expired idempotency keys, in small batches (--only inbox|idempotency-keys, --json)", runRetention},
		"version":            {"print version and build info", runVersion},
	}
}

// exitError carries an exit code other than 1 (reconcile's 1 and 2).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help":
		usage(stdout)
		return 0
	case "--version", "-v":
		args = []string{"version"}
	case "help":
		// `posthorn help outbox status` is `posthorn outbox status --help`.
		if len(args) == 1 {
			usage(stdout)
			return 0
		}
		args = append(args[1:len(args):len(args)], "--help")
	}
	// "config print", "outbox status": two-word commands are registered with
	// their space.
	name := args[0]
	rest := args[1:]
	if len(args) > 1 {
		if _, ok := commands[args[0]+" "+args[1]]; ok {
			name, rest = args[0]+" "+args[1], args[2:]
		}
	}
	cmd, ok := commands[name]
	if !ok {
		if isGroup(name) {
			if len(rest) > 0 && (rest[0] == "--help" || rest[0] == "-h") {
				printGroupHelp(stdout, name)
				return 0
			}
			if len(rest) > 0 {
				fmt.Fprintf(stderr, "posthorn: unknown command %q\n\n", name+" "+rest[0])
			}
			printGroupHelp(stderr, name)
			return 2
		}
		fmt.Fprintf(stderr, "posthorn: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signalContext()
	defer stop()
	err := cmd.run(ctx, rest)
	switch {
	case err == nil, errors.Is(err, pflag.ErrHelp):
		return 0
	default:
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.err != nil {
				fmt.Fprintf(stderr, "posthorn %s: %v\n", name, ee.err)
			}
			return ee.code
		}
		fmt.Fprintf(stderr, "posthorn %s: %v\n", name, err)
		return 1
	}
}

// signalContext is cancelled by the first SIGINT or SIGTERM, so long-running
// commands stop softly (finish or abandon the batch, release leases); a
// second signal exits at once.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
			return
		}
		<-ch
		os.Exit(1)
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}
