package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/posthorn/posthorn/core"
)

// Defaults of LoadConfig.
const (
	DefaultWorkers  = 4
	DefaultAccounts = 40
)

// DefaultCurrencies are the currencies of the random transfers.
var DefaultCurrencies = []string{"EUR", "USD"}

// LoadConfig configures Load: Postings random balanced transfers posted
// through the Posting API at BaseURL by Workers concurrent clients.
type LoadConfig struct {
	// BaseURL is the API's root, e.g. http://127.0.0.1:8080.
	BaseURL string
	// Token is sent as a bearer token when not empty.
	Token string
	// Postings is how many postings to commit.
	Postings int
	// Workers is the number of concurrent clients; default DefaultWorkers.
	Workers int
	// Accounts is the number of accounts the transfers move money between;
	// default DefaultAccounts. Their IDs are AccountPrefix + index.
	Accounts      int
	AccountPrefix string
	// Currencies default to DefaultCurrencies.
	Currencies []string
	// KeyPrefix makes the Idempotency-Keys of this run unique (a run ID).
	KeyPrefix string
	// Rate caps the postings per second over all workers; 0 means as fast
	// as the API answers.
	Rate float64
	// Seed makes the transfers reproducible; 0 picks one from the clock.
	Seed uint64
	// Client is the HTTP client; default one with a 60 s timeout that
	// keeps a connection per worker open between requests.
	Client *http.Client
	// OnPosted is called after each committed posting (from any worker).
	OnPosted func(core.PostingResult)
}

// LoadResult is what Load committed.
type LoadResult struct {
	// Postings is the number of committed postings, Events the number of
	// events they wrote (one per line).
	Postings int
	Events   int
	// Retries counts requests repeated with the same Idempotency-Key after
	// a transport error or a 5xx answer.
	Retries int
	// Replayed counts 200 answers: a retried request whose first attempt
	// had committed.
	Replayed int
}

// maxAttempts bounds the retries of one posting; the API being down for
// longer than that is a failure of the run.
const maxAttempts = 50

// Load posts cfg.Postings random balanced transfers and returns once all
// committed, or with the first error that retries could not get past.
// Every posting has its own Idempotency-Key, and a failed attempt is
// retried with the same key and body, so a retry never posts twice.
func Load(ctx context.Context, cfg LoadConfig) (LoadResult, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Accounts <= 1 {
		cfg.Accounts = DefaultAccounts
	}
	if len(cfg.Currencies) == 0 {
		cfg.Currencies = DefaultCurrencies
	}
	if cfg.Client == nil {
		// http.DefaultTransport keeps two idle connections per host: the
		// other workers would dial and tear down a TCP connection for
		// every posting, on both sides, which at a few hundred postings
		// per second is CPU the API's own work competes for.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = cfg.Workers, cfg.Workers
		defer t.CloseIdleConnections()
		cfg.Client = &http.Client{Timeout: 60 * time.Second, Transport: t}
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	var (
		next     atomic.Int64
		res      LoadResult
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var tick <-chan time.Time
	if cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer t.Stop()
		tick = t.C
	}
	for w := 0; w < cfg.Workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(w)))
			for {
				i := next.Add(1) - 1
				if i >= int64(cfg.Postings) || ctx.Err() != nil {
					return
				}
				if tick != nil {
					select {
					case <-tick:
					case <-ctx.Done():
						return
					}
				}
				body := RandomTransfer(rng, cfg.AccountPrefix, cfg.Accounts, cfg.Currencies)
				key := cfg.KeyPrefix + strconv.FormatInt(i, 10)
				r, retries, replayed, err := postOnce(ctx, cfg, key, body)
				mu.Lock()
				res.Retries += retries
				if err != nil {
					if firstErr == nil && ctx.Err() == nil {
						firstErr = fmt.Errorf("posting %d (Idempotency-Key %s): %w", i, key, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				res.Postings++
				res.Events += len(r.Events)
				if replayed {
					res.Replayed++
				}
				mu.Unlock()
				if cfg.OnPosted != nil {
					cfg.OnPosted(r)
				}
			}
		}(w)
	}
	wg.Wait()
	if firstErr == nil && res.Postings < cfg.Postings {
		firstErr = context.Cause(ctx)
		if firstErr == nil {
			firstErr = errors.New("load stopped early")
		}
	}
	return res, firstErr
}

// RandomTransfer returns the JSON body of one balanced posting of 2 to 4
// lines between distinct accounts prefix0 … prefix(n-1): a transfer A→B,
// a split A→B+C, or two transfers in two currencies. Amounts are in minor
// units, 1 to 100,000.
func RandomTransfer(rng *rand.Rand, prefix string, accounts int, currencies []string) []byte {
	lines := min(2+rng.IntN(3), accounts)
	picked := distinct(rng, accounts, lines)
	acc := func(i int) string { return prefix + strconv.Itoa(picked[i]) }
	amt := func() int64 { return 1 + rng.Int64N(100000) }
	line := func(account, direction string, amount int64, currency string) transferLine {
		return transferLine{account, direction, strconv.FormatInt(amount, 10), currency}
	}
	cur := currencies[rng.IntN(len(currencies))]
	var es []transferLine
	switch lines {
	case 2:
		a := amt()
		es = []transferLine{line(acc(0), "debit", a, cur), line(acc(1), "credit", a, cur)}
	case 3:
		a, b := amt(), amt()
		es = []transferLine{line(acc(0), "debit", a+b, cur), line(acc(1), "credit", a, cur), line(acc(2), "credit", b, cur)}
	default:
		cur2 := currencies[rng.IntN(len(currencies))]
		a, b := amt(), amt()
		es = []transferLine{line(acc(0), "debit", a, cur), line(acc(1), "credit", a, cur),
			line(acc(2), "debit", b, cur2), line(acc(3), "credit", b, cur2)}
	}
	body, _ := json.Marshal(transferBody{Entries: es, Metadata: demoMetadata})
	return body
}

type transferLine struct {
	Account   string `json:"account"`
	Direction string `json:"direction"`
	Amount    string `json:"amount"`
	Currency  string `json:"currency"`
}

type transferBody struct {
	Entries  []transferLine    `json:"entries"`
	Metadata map[string]string `json:"metadata"`
}

var demoMetadata = map[string]string{"source": "posthorn-demo"}

// distinct returns k distinct integers in [0, n), k ≤ n, each k-subset
// equally likely, in random order. It redraws repeats: for the few lines
// of a posting out of many accounts that is a handful of draws, where a
// permutation of all n cost an n-element allocation and n swaps per
// posting (12 µs against 1.3 for the whole body at 1,000 accounts), CPU
// the load generator takes from the machine it measures.
func distinct(rng *rand.Rand, n, k int) []int {
	out := make([]int, 0, k)
	for len(out) < k {
		i := rng.IntN(n)
		if !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	return out
}

// postOnce posts body under key, retrying transport errors and 5xx answers
// with the same key (the API answers a committed key with 200 and the
// stored result). A 4xx answer is returned as an error at once.
func postOnce(ctx context.Context, cfg LoadConfig, key string, body []byte) (core.PostingResult, int, bool, error) {
	var lastErr error
	wait := 50 * time.Millisecond
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return core.PostingResult{}, attempt - 1, false, ctx.Err()
			}
			wait = min(2*wait, 2*time.Second)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.BaseURL+"/v1/postings", bytes.NewReader(body))
		if err != nil {
			return core.PostingResult{}, attempt, false, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		if cfg.Token != "" {
			req.Header.Set("Authorization", "Bearer "+cfg.Token)
		}
		resp, err := cfg.Client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return core.PostingResult{}, attempt, false, ctx.Err()
			}
			lastErr = err
			continue
		}
		data, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch {
		case rerr != nil:
			lastErr = rerr
			continue
		case resp.StatusCode >= 500:
			lastErr = fmt.Errorf("API answered %s: %.300s", resp.Status, data)
			continue
		case resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK:
			return core.PostingResult{}, attempt, false, fmt.Errorf("API answered %s: %.300s", resp.Status, data)
		}
		var r core.PostingResult
		if err := json.Unmarshal(data, &r); err != nil {
			return core.PostingResult{}, attempt, false, fmt.Errorf("API response: %w", err)
		}
		return r, attempt, resp.StatusCode == http.StatusOK, nil
	}
	return core.PostingResult{}, maxAttempts - 1, false, fmt.Errorf("gave up after %d attempts: %w", maxAttempts, lastErr)
}
