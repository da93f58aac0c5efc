package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/configs"
	"github.com/posthorn/posthorn/ops"
)

func runReplay(ctx context.Context, args []string) error {
	fs := newFlags("replay", "database.url", "sink.kind", "sink.kafka.brokers", "archive.dir")
	fromSeq := fs.Int64("from-sequence", 0, "first journal sequence of the range (inclusive)")
	toSeq := fs.Int64("to-sequence", 0, "last journal sequence of the range (inclusive)")
	fromTime := fs.String("from-time", "", "events that occurred at or after this RFC 3339 time")
	toTime := fs.String("to-time", "", "events that occurred before this RFC 3339 time")
	account := fs.String("account", "", "only this account's events")
	topic := fs.String("topic", "", "send to this topic instead of the original one")
	commands := fs.Bool("include-commands", false, "replay commands too (never without this flag)")
	ratePerSec := fs.Float64("rate", 0, "most events per second (0: unlimited)")
	resume := fs.String("resume", "", "name of this replay: its position is saved, and a later run with the same name continues after the last ACKed batch")
	batch := fs.Int("batch", 500, "most events per publish")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	var spec ops.ReplaySpec
	checks := func(*configs.Config) (err error) {
		spec = ops.ReplaySpec{SequenceFrom: *fromSeq, SequenceTo: *toSeq, Account: *account, Topic: *topic, IncludeCommands: *commands}
		for _, t := range []struct {
			flag string
			v    string
			dst  *time.Time
		}{{"--from-time", *fromTime, &spec.From}, {"--to-time", *toTime, &spec.To}} {
			if t.v == "" {
				continue
			}
			if *t.dst, err = time.Parse(time.RFC3339Nano, t.v); err != nil {
				return fmt.Errorf("%s %q: want RFC 3339, e.g. 2026-11-29T20:00:00Z", t.flag, t.v)
			}
		}
		switch {
		case *fromSeq < 0 || *toSeq < 0:
			return fmt.Errorf("--from-sequence and --to-sequence must be positive")
		case *toSeq > 0 && *fromSeq > *toSeq:
			return fmt.Errorf("--from-sequence %d is after --to-sequence %d", *fromSeq, *toSeq)
		case *ratePerSec < 0:
			return fmt.Errorf("--rate must not be negative, is %g", *ratePerSec)
		case *batch < 1:
			return fmt.Errorf("--batch must be at least 1, is %d", *batch)
		}
		return nil
	}
	p, err := fs.start(ctx, args, needs{ledger: 2, archive: true, sink: true, check: checks})
	if err != nil {
		return err
	}
	defer p.close()
	log := p.log

	// A progress bar on a terminal; plain log lines otherwise.
	var bar *progressbar.ProgressBar
	lastLog := time.Time{}
	progress := func(sent, total int64) {
		if isTerminal(os.Stdout) && !*asJSON {
			if bar == nil {
				bar = progressbar.NewOptions64(total, progressbar.OptionSetDescription("replay"),
					progressbar.OptionShowCount(), progressbar.OptionShowIts(),
					progressbar.OptionSetWriter(os.Stdout), progressbar.OptionThrottle(100*time.Millisecond))
			}
			_ = bar.Set64(sent)
			return
		}
		if time.Since(lastLog) >= time.Second || sent == total {
			lastLog = time.Now()
			log.Info("replay progress", slog.Int64("sent", sent), slog.Int64("total", total))
		}
	}
	res, err := ops.Replay(ctx, ops.ReplayConfig{
		Ledger: opsstore.New(p.ledger), Archive: p.archive, Sink: p.sink, Spec: spec, Name: *resume,
		Rate: *ratePerSec, Batch: *batch, Progress: progress,
	})
	if bar != nil {
		_ = bar.Finish()
		fmt.Println()
	}
	if err != nil && ctx.Err() != nil {
		// Stopped by SIGINT/SIGTERM: every ACKed batch is saved; a soft stop.
		if *resume == "" {
			fmt.Printf("interrupted after %d events (through outbox id %d); this replay had no --resume name and starts over if run again\n", res.Sent, res.LastID)
		} else {
			fmt.Printf("interrupted after %d events (through outbox id %d); run again with --resume %s to continue\n", res.Sent, res.LastID, *resume)
		}
		return nil
	}
	if err != nil {
		if *resume != "" && res.Sent > 0 {
			return fmt.Errorf("%w (resume with --resume %s: it continues after outbox id %d)", err, *resume, res.LastID)
		}
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	if res.AlreadyDone {
		fmt.Printf("replay %s already finished: %d events sent, through outbox id %d\n", *resume, res.Sent, res.LastID)
		return nil
	}
	fmt.Printf("replayed %d events (%d from the archive) through outbox id %d to sink %s\n", res.Sent, res.FromArchive, res.LastID, p.cfg.Sink.Kind)
	return nil
}
