package inboxstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres/inboxstore"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// conflictPath is one way an event reaches a consumer's inbox: the Go
// inbox one event at a time or in batches, or the SQL function.
type conflictPath struct {
	name    string
	ordered bool
	// deliver records one step's events (a batch for the batch paths) and
	// returns each one's disposition as the path reports it.
	deliver func(t *testing.T, r *conflictRig, es []core.Envelope) []string
}

// conflictRig is one consumer database under one rule.
type conflictRig struct {
	pool  *pgxpool.Pool
	in    *inboxstore.Inbox
	apply func(context.Context, pgx.Tx, core.Envelope) error
	read  func() []string
}

const conflictConsumer = "c"

func goReceive(ordered bool) func(*testing.T, *conflictRig, []core.Envelope) []string {
	return func(t *testing.T, r *conflictRig, es []core.Envelope) []string {
		var ds []string
		for _, e := range es {
			out, err := r.in.Receive(context.Background(), conflictConsumer, ordered, e, r.apply)
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, string(out.Disposition))
		}
		return ds
	}
}

func goBatch(ordered bool) func(*testing.T, *conflictRig, []core.Envelope) []string {
	return func(t *testing.T, r *conflictRig, es []core.Envelope) []string {
		res, err := r.in.ReceiveBatch(context.Background(), conflictConsumer, ordered, es, r.apply, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, o := range res.Outcomes {
			ds = append(ds, string(o.Disposition))
		}
		return ds
	}
}

// sqlDeliver calls posthorn_inbox_receive per event, as a consumer outside
// Go would, writing the effect in the same transaction on "apply".
func sqlDeliver(ordered bool) func(*testing.T, *conflictRig, []core.Envelope) []string {
	return func(t *testing.T, r *conflictRig, es []core.Envelope) []string {
		ctx := context.Background()
		var ds []string
		for _, e := range es {
			h, err := json.Marshal(e.WireHeaders())
			if err != nil {
				t.Fatal(err)
			}
			var d string
			err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
				if err := tx.QueryRow(ctx, `SELECT disposition FROM posthorn_inbox_receive($1, $2::text::jsonb, $3)`,
					conflictConsumer, string(h), ordered).Scan(&d); err != nil {
					return err
				}
				if d == "apply" {
					return r.apply(ctx, tx, e)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if d == "apply" {
				d = string(core.DispositionApplied)
			}
			ds = append(ds, d)
		}
		return ds
	}
}

var conflictPaths = []conflictPath{
	{"receive/ordered", true, goReceive(true)},
	{"batch/ordered", true, goBatch(true)},
	{"sql/ordered", true, sqlDeliver(true)},
	{"receive/unordered", false, goReceive(false)},
	{"batch/unordered", false, goBatch(false)},
	{"sql/unordered", false, sqlDeliver(false)},
}

// newConflictRig is a fresh consumer database with the rule of today, or
// with oldRule the one before revision conflicts: the Go inbox's
// NewUnsafeRevisionOnly and migration 00003's posthorn_inbox_receive.
func newConflictRig(t *testing.T, oldRule bool) *conflictRig {
	t.Helper()
	_, pool := pgtest.Consumer(t)
	apply, read := effects(t, pool)
	r := &conflictRig{pool: pool, in: inboxstore.New(pool), apply: apply, read: read}
	if oldRule {
		r.in = inboxstore.NewUnsafeRevisionOnly(pool)
		sql, err := os.ReadFile("../migrations/consumer/00003_sql_inbox.sql")
		if err != nil {
			t.Fatal(err)
		}
		body := string(sql)
		body = body[strings.Index(body, "-- +goose StatementBegin"):strings.Index(body, "-- +goose StatementEnd")]
		body = strings.Replace(body, "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
		if _, err := pool.Exec(context.Background(), body); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// conflictState is what a consumer recorded, as the paths must agree on it.
type conflictState struct {
	rows      []string // event_id disposition conflicts_with: reason
	positions []string // aggregate last parked: reason
	effects   []string
}

func readConflictState(t *testing.T, r *conflictRig) conflictState {
	t.Helper()
	return conflictState{
		rows: pgtest.Column[string](t, r.pool, `SELECT event_id || ' ' || disposition || ' ' || coalesce(conflicts_with, '-') || ': ' || coalesce(reason, '')
			FROM consumer_inbox WHERE consumer = $1 ORDER BY event_id`, conflictConsumer),
		positions: pgtest.Column[string](t, r.pool, `SELECT aggregate_id || ' ' || last_revision || ' ' || parked || ': ' || coalesce(parked_reason, '')
			FROM consumer_positions WHERE consumer = $1 ORDER BY aggregate_id`, conflictConsumer),
		effects: r.read(),
	}
}

// failoverSteps: acc-1's revisions 1 and 2 applied (A), then a different
// event at revision 2 (B, as a ledger that failed over to a standby
// missing A reissues it), delivered beside a resend of A; then A's replay
// and resends of both.
func failoverSteps() (a1, a2, b2 core.Envelope, steps [][]core.Envelope) {
	a1, a2 = inboxEvent("acc-1", 1), inboxEvent("acc-1", 2)
	b2 = withID(inboxEvent("acc-1", 2), "acc-1-r2-reissued")
	replay := a2
	replay.Replay = true
	return a1, a2, b2, [][]core.Envelope{{a1, a2}, {a2, b2}, {replay}, {b2, a1}}
}

// TestRevisionConflictEveryPath: every path (Go one by one, Go batch, the
// SQL function; ordered and unordered) records another event ID at an
// applied revision as revision_conflict naming both IDs, does not apply
// it, and parks an ordered consumer's aggregate; resends and replays keep
// their event IDs and stay duplicates; the Go and SQL paths record the same
// rows and positions. Negative control: under the old rule (the Go inbox's
// NewUnsafeRevisionOnly, migration 00003's function) the same
// deliveries record no conflict and absorb B silently (a duplicate for
// an ordered consumer, a plain apply for an unordered one), and the checks
// below would fail.
func TestRevisionConflictEveryPath(t *testing.T) {
	t.Parallel()
	states := make([]conflictState, len(conflictPaths))
	for pi, p := range conflictPaths {
		t.Run(p.name, func(t *testing.T) {
			a1, a2, b2, steps := failoverSteps()
			var (
				conflicts, absorbed [2]int
			)
			for ri, oldRule := range []bool{false, true} {
				r := newConflictRig(t, oldRule)
				var got [][]string
				for _, s := range steps {
					got = append(got, p.deliver(t, r, s))
				}
				st := readConflictState(t, r)
				for _, row := range st.rows {
					if strings.HasPrefix(row, b2.EventID+" revision_conflict "+a2.EventID+": ") {
						conflicts[ri]++
					}
					if strings.HasPrefix(row, b2.EventID+" duplicate ") || strings.HasPrefix(row, b2.EventID+" applied ") {
						absorbed[ri]++
					}
				}
				t.Logf("old rule %v: conflicts recorded %d, absorbed silently %d; dispositions by step %v; rows %q; positions %q",
					oldRule, conflicts[ri], absorbed[ri], got, st.rows, st.positions)
				if oldRule {
					continue
				}
				states[pi] = st
				if !slices.Equal(got[1], []string{"duplicate", "revision_conflict"}) {
					t.Errorf("resend of A with B: %v, want the resend a duplicate and B a revision_conflict", got[1])
				}
				if got[2][0] != "duplicate" || got[3][0] != "duplicate" || got[3][1] != "duplicate" {
					t.Errorf("replay and resends: %v %v, want duplicates (same event IDs)", got[2], got[3])
				}
				if want := []string{a1.EventID, a2.EventID}; !slices.Equal(st.effects, want) {
					t.Errorf("effects %v, want %v: B is not applied", st.effects, want)
				}
				var headers bool
				if err := r.pool.QueryRow(context.Background(), `SELECT headers IS NOT NULL FROM consumer_inbox WHERE event_id = $1`,
					b2.EventID).Scan(&headers); err != nil || !headers {
					t.Errorf("the conflicting event's headers are not kept (%v)", err)
				}
				reason := "revision_conflict: revision 2 applied as event acc-1-r2, received as event acc-1-r2-reissued"
				if p.ordered && (len(st.positions) != 1 || st.positions[0] != "acc-1 2 true: "+reason) {
					t.Errorf("positions %q, want acc-1 parked at 2 with reason %q", st.positions, reason)
				}
			}
			if conflicts != [2]int{1, 0} || absorbed != [2]int{0, 1} {
				t.Fatalf("conflicts recorded %v, absorbed silently %v (rule of today, old rule): want [1 0] and [0 1]", conflicts, absorbed)
			}
		})
	}
	if !t.Failed() {
		// The paths of one kind recorded the same: the Go inbox one by one
		// and in batches, and the SQL function (which keeps no payload and
		// counts no duplicate on a row, so neither is compared).
		for _, group := range [][]int{{0, 1, 2}, {3, 4, 5}} {
			for _, i := range group[1:] {
				a, b := states[group[0]], states[i]
				if !slices.Equal(a.rows, b.rows) || !slices.Equal(a.positions, b.positions) || !slices.Equal(a.effects, b.effects) {
					t.Errorf("%s and %s disagree:\n%+v\n%+v", conflictPaths[group[0]].name, conflictPaths[i].name, a, b)
				}
			}
		}
	}
}

// A held event whose revision another event ID took before it was
// re-driven is a conflict too: Drain records it and parks the aggregate.
// acc-1 r3 (X) is held behind a gap; a batch applies r2 and r3 (A); the
// drain then finds X at an applied revision. Negative control: the old
// rule records X as a duplicate.
func TestRevisionConflictOnDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, oldRule := range []bool{false, true} {
		r := newConflictRig(t, oldRule)
		x := withID(inboxEvent("acc-1", 3), "acc-1-r3-other")
		mustReceive(t, r.in, conflictConsumer, true, inboxEvent("acc-1", 1), r.apply, core.DispositionApplied)
		mustReceive(t, r.in, conflictConsumer, true, x, r.apply, core.DispositionHeld)
		res, err := r.in.ReceiveBatch(ctx, conflictConsumer, true, []core.Envelope{inboxEvent("acc-1", 2), inboxEvent("acc-1", 3)}, r.apply, nil)
		if err != nil || len(res.Held) != 1 {
			t.Fatalf("batch: %+v, %v; want acc-1 with a held event", res, err)
		}
		outs, err := r.in.Drain(ctx, conflictConsumer, true, core.AggregateAccount, "acc-1", r.apply)
		if err != nil || len(outs) != 1 {
			t.Fatalf("drain: %+v, %v", outs, err)
		}
		st := readConflictState(t, r)
		t.Logf("old rule %v: drained %+v; rows %q; positions %q", oldRule, outs[0], st.rows, st.positions)
		if oldRule {
			if outs[0].Disposition != core.DispositionDuplicate {
				t.Fatalf("control: the old rule drained %+v, want a silent duplicate", outs[0])
			}
			continue
		}
		if o := outs[0]; o.Disposition != core.DispositionRevisionConflict || o.ConflictsWith != "acc-1-r3" || o.EventID != x.EventID {
			t.Fatalf("drained %+v, want X a revision_conflict naming acc-1-r3", o)
		}
		if !slices.Equal(st.effects, []string{"acc-1-r1", "acc-1-r2", "acc-1-r3"}) || len(st.positions) != 1 ||
			!strings.HasPrefix(st.positions[0], "acc-1 3 true: revision_conflict: ") {
			t.Fatalf("effects %v, positions %q: want X not applied and acc-1 parked", st.effects, st.positions)
		}
	}
}

// Two events of one revision in the same batch: the first (by event ID) is
// applied, the second is a conflict naming it, for both kinds of consumer;
// a third at the same revision names the first too. Negative control: the
// old rule absorbs the second (ordered) or applies it (unordered).
func TestRevisionConflictInOneBatch(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{true, false} {
		for _, oldRule := range []bool{false, true} {
			r := newConflictRig(t, oldRule)
			a, b, c := inboxEvent("acc-1", 1), withID(inboxEvent("acc-1", 1), "acc-1-r1-second"), withID(inboxEvent("acc-1", 1), "acc-1-r1-third")
			ds := goBatch(ordered)(t, r, []core.Envelope{b, a})
			ds = append(ds, goReceive(ordered)(t, r, []core.Envelope{c})...)
			st := readConflictState(t, r)
			t.Logf("ordered %v, old rule %v: %v; rows %q", ordered, oldRule, ds, st.rows)
			want := []string{"revision_conflict", "applied", "revision_conflict"}
			if oldRule {
				want = []string{"duplicate", "applied", "duplicate"}
				if !ordered {
					want = []string{"applied", "applied", "applied"}
				}
			}
			if !slices.Equal(ds, want) {
				t.Fatalf("ordered %v, old rule %v: %v, want %v", ordered, oldRule, ds, want)
			}
			if !oldRule {
				for _, row := range st.rows[1:] {
					if !strings.Contains(row, " revision_conflict acc-1-r1: ") {
						t.Fatalf("rows %q: want both later events to name acc-1-r1", st.rows)
					}
				}
			}
		}
	}
}

// A consumer started from a baseline has positions without applied rows:
// an event at or below them has nothing to be compared with and stays a
// duplicate (the baseline's promise), on both paths.
func TestRevisionBelowBaselineStaysDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, p := range []conflictPath{conflictPaths[0], conflictPaths[1], conflictPaths[2]} {
		r := newConflictRig(t, false)
		if err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			return r.in.SetPositions(ctx, tx, conflictConsumer, map[core.AggregateKey]int64{{Type: core.AggregateAccount, ID: "acc-1"}: 5})
		}); err != nil {
			t.Fatal(err)
		}
		if ds := p.deliver(t, r, []core.Envelope{inboxEvent("acc-1", 4)}); ds[0] != "duplicate" {
			t.Fatalf("%s: %v, want duplicate", p.name, ds)
		}
		if got := fmt.Sprint(readConflictState(t, r).positions); !strings.Contains(got, "acc-1 5 false") {
			t.Fatalf("%s: positions %s", p.name, got)
		}
	}
}
