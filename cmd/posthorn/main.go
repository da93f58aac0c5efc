// Command posthorn is the transactional-outbox relay and its tools. Each
// subcommand lives in its own file and registers itself in init; this file
// holds the dispatch, the shared flags, the logger and signal handling.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/posthorn/posthorn/configs"
)

// command is one subcommand. run returns an error to print and exit 1, or an
// *exitError for another code.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

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
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
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

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: posthorn COMMAND [--config FILE] [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-16s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nEvery command takes --config FILE and --help.")
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

// flagSet returns a flag set with the shared --config flag.
func flagSet(name string) (*pflag.FlagSet, *string) {
	fs := pflag.NewFlagSet("posthorn "+name, pflag.ContinueOnError)
	path := fs.String("config", "", "YAML configuration file")
	return fs, path
}

// keyFlags adds flags named by configuration keys (e.g. --database.url);
// a flag that is set overrides the file and the environment.
func keyFlags(fs *pflag.FlagSet, keys ...string) {
	for _, k := range keys {
		fs.String(k, "", "sets config key "+k)
	}
}

// loadConfig parses args into fs and loads the configuration.
func loadConfig(fs *pflag.FlagSet, path *string, args []string) (configs.Config, error) {
	if err := fs.Parse(args); err != nil {
		return configs.Config{}, err
	}
	return configs.Load(*path, nil, fs)
}

// newLogger returns the structured logger the configuration asks for.
func newLogger(cfg configs.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Level))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
