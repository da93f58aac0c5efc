package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/demo"
)

// post posts through the API at baseURL, restarting the relay and the
// consumers at a third (soft stop, new instances) and at two thirds (the
// relay cut short, as a crash would) of the postings.
func (d *demoRun) post(ctx context.Context, relayPool *pgxpool.Pool, baseURL string, postings int) error {
	bar := d.progressBar(postings, "posting")
	var (
		mu      sync.Mutex
		posted  int
		restart = make(chan string, 2)
	)
	loadDone := make(chan error, 1)
	go func() {
		var err error
		d.load, err = demo.Load(ctx, demo.LoadConfig{
			BaseURL:       baseURL,
			Token:         firstToken(d.cfg.API.Tokens),
			Postings:      postings,
			Workers:       d.workers,
			Accounts:      d.accounts,
			AccountPrefix: "acc-",
			KeyPrefix:     fmt.Sprintf("demo-%d-", d.started.UnixNano()),
			OnPosted: func(core.PostingResult) {
				mu.Lock()
				posted++
				n := posted
				mu.Unlock()
				if bar != nil {
					_ = bar.Add(1)
				}
				switch n {
				case max(1, postings/3):
					restart <- "soft"
				case max(2, 2*postings/3):
					restart <- "hard"
				}
			},
		})
		loadDone <- err
	}()
	for waiting := true; waiting; {
		select {
		case kind := <-restart:
			if err := d.restart(relayPool, kind == "hard"); err != nil {
				return err
			}
		case err := <-d.consDone:
			return fmt.Errorf("consumers stopped: %w", err)
		case err := <-loadDone:
			if err != nil {
				return fmt.Errorf("posting through the API: %w", err)
			}
			waiting = false
		}
	}
	for len(restart) > 0 { // a tiny run may end before its restarts
		if err := d.restart(relayPool, <-restart == "hard"); err != nil {
			return err
		}
	}
	if bar != nil {
		_ = bar.Finish()
	}
	return nil
}

// waitDelivered polls until every event is relayed and applied by both
// consumers, or the timeout passes.
func (d *demoRun) waitDelivered(ctx context.Context) error {
	deadline := time.Now().Add(d.timeout)
	p, err := demo.ReadProgress(ctx, d.ledger, d.consumer, demoConsumers)
	if err != nil {
		return err
	}
	bar := d.progressBar(int(p.Events), "delivering")
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if bar != nil {
			_ = bar.Set64(p.Events - p.Lag())
		}
		if p.Delivered() {
			if bar != nil {
				_ = bar.Finish()
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not delivered within --timeout %s: %d events, %d unrelayed, applied %v", d.timeout, p.Events, p.Unrelayed, p.Applied)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-d.consDone:
			return fmt.Errorf("consumers stopped: %w", err)
		case <-tick.C:
		}
		if p, err = demo.ReadProgress(ctx, d.ledger, d.consumer, demoConsumers); err != nil {
			return err
		}
	}
}

// progressBar returns a bar on a terminal, nil otherwise (and with --json).
func (d *demoRun) progressBar(n int, what string) *progressbar.ProgressBar {
	if d.json || !isTerminal(os.Stdout) {
		return nil
	}
	return progressbar.NewOptions(n,
		progressbar.OptionSetWriter(os.Stdout),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("it"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stdout) }),
	)
}

func firstToken(ts []string) string {
	if len(ts) == 0 {
		return ""
	}
	return ts[0]
}
