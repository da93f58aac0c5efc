package horizon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The load's shape: what publishers and API clients write, and how many
// of them there are. A worker makes one call at a time, so when the
// database slows the calls down, the workers fall behind the asked rate
// and the rate reached shows it (the publishers slowed by a
// quarter under the old design).
const (
	publishers     = 8
	hotAggregates  = 8       // half of the published events
	coldAggregates = 100_000 // the other half, spread evenly
	aggregateType  = "order" // published to events.order
	apiClients     = 4
	hotAccounts    = 4      // every posting debits one of them
	coldAccounts   = 10_000 // and credits one of these
)

// call is one publish or posting: when it ended, how long it took, and
// whether it committed.
type call struct {
	end time.Time
	dur time.Duration
	ok  bool
}

// calls collects a load's calls and the event IDs they committed.
type calls struct {
	mu       sync.Mutex
	list     []call
	ids      []string
	firstErr error
	failed   int
}

func (c *calls) add(start time.Time, ids []string, err error) {
	end := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, call{end: end, dur: end.Sub(start), ok: err == nil})
	if err != nil {
		c.failed++
		if c.firstErr == nil {
			c.firstErr = err
		}
		return
	}
	c.ids = append(c.ids, ids...)
}

// pace hands out rate tokens a second, every 10 ms, until ctx ends, then
// closes the channel. Tokens the workers do not take within about 100 ms
// are dropped: a worker that falls behind does not catch up in a burst,
// so the rate reached is what the database let through.
func pace(ctx context.Context, rate int) <-chan struct{} {
	ch := make(chan struct{}, max(rate/10, 1))
	go func() {
		defer close(ch)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		var owed float64
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for owed += float64(rate) / 100; owed >= 1; owed-- {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return ch
}

// publish runs the publishers at rate events a second until ctx ends:
// each token is one posthorn_publish in a transaction of its own, on a hot
// aggregate or a cold one, half and half.
func publish(ctx context.Context, pool *pgxpool.Pool, rate int, out *calls) *sync.WaitGroup {
	tokens := pace(ctx, rate)
	var wg sync.WaitGroup
	for w := range publishers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 43))
			for range tokens {
				agg := fmt.Sprintf("cold-%d", rng.IntN(coldAggregates))
				if rng.IntN(2) == 0 {
					agg = fmt.Sprintf("hot-%d", rng.IntN(hotAggregates))
				}
				start := time.Now()
				var id string
				err := pool.QueryRow(context.WithoutCancel(ctx),
					`SELECT event_id::text FROM posthorn_publish($1, $2, 'order.placed', $3::jsonb)`,
					aggregateType, agg, fmt.Sprintf(`{"order":%q,"amount":"%d"}`, agg, rng.IntN(100000))).Scan(&id)
				out.add(start, []string{id}, err)
			}
		})
	}
	return &wg
}

// post runs the API clients at rate postings a second until ctx ends:
// each token is one POST /v1/postings of two entries, a debit of a hot
// account and a credit of a cold one.
func post(ctx context.Context, api string, rate int, out *calls) *sync.WaitGroup {
	client := newHTTPClient()
	tokens := pace(ctx, rate)
	var wg sync.WaitGroup
	for w := range apiClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 44))
			for range tokens {
				body := fmt.Sprintf(`{"entries":[{"account":"acc-hot-%d","direction":"debit","amount":"%d","currency":"EUR"},`+
					`{"account":"acc-cold-%d","direction":"credit","amount":"%[2]d","currency":"EUR"}]}`,
					rng.IntN(hotAccounts), rng.IntN(10000)+1, rng.IntN(coldAccounts))
				start := time.Now()
				ids, err := postOne(context.WithoutCancel(ctx), client, api, body)
				out.add(start, ids, err)
			}
		})
	}
	return &wg
}

func newHTTPClient() *http.Client {
	return &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: apiClients, MaxConnsPerHost: apiClients}}
}

// postOne posts one posting and returns its events' IDs.
func postOne(ctx context.Context, client *http.Client, api, body string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/v1/postings", bytes.NewBufferString(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("POST /v1/postings: %s: %s", resp.Status, raw)
	}
	var ans struct {
		Events []struct {
			EventID string `json:"event_id"`
		} `json:"events"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil {
		return nil, fmt.Errorf("POST /v1/postings: %w: %s", err, raw)
	}
	ids := make([]string, len(ans.Events))
	for i, e := range ans.Events {
		ids[i] = e.EventID
	}
	return ids, nil
}
