package ledgerstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/posthorn/posthorn/core"
)

// This file is the ledger's write path: the steps of Store.Post.

// line is one journal line with its place in the account's history.
type line struct {
	core.Entry
	revision int64
	eventID  uuid.UUID
	// balanceAfter is the account's balance in the line's currency after
	// it: what the account's next line in the currency starts from.
	balanceAfter int64
}

// post writes p in one transaction, in the steps Post lists.
func (s *Store) post(ctx context.Context, key string, hash [32]byte, p core.Posting) (core.PostingResult, error) {
	wireMD, err := s.wireMetadata(p.Metadata)
	if err != nil {
		return core.PostingResult{}, err
	}
	traceMD := core.TraceHeaders(ctx)
	if traceMD != nil {
		wireMD = withTrace(wireMD, traceMD)
	}
	// Every event carries the key's digest: a failover that loses the
	// posting keeps, in what the world saw, what a retry of the key must
	// answer.
	eventMD := make(map[string]string, len(wireMD)+1)
	maps.Copy(eventMD, wireMD)
	eventMD[core.HeaderIdempotencyDigest] = core.IdempotencyDigest(key, hash)
	plan, err := planPosting(p)
	if err != nil {
		return core.PostingResult{}, err
	}
	// The transaction is two round trips: BEGIN travels with step 1's
	// batch and COMMIT with the final one. An error aborts the
	// transaction, and the statements queued after it are not run.
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return core.PostingResult{}, fmt.Errorf("begin posting: %w", err)
	}
	defer func() {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			// Roll back an aborted or unfinished transaction, so the
			// connection goes back to the pool clean.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		conn.Release()
	}()
	tx := connTx{conn.Conn()}
	if s.cfg.History != nil {
		if err := s.cfg.History.Check(ctx); err != nil {
			return core.PostingResult{}, err
		}
	}

	locked, err := lockAccounts(ctx, tx, plan, eventMD[core.HeaderIdempotencyDigest])
	if err != nil {
		return core.PostingResult{}, err
	}
	res, lines, err := assignIDs(p, plan, locked)
	if err != nil {
		return core.PostingResult{}, err
	}

	// Step 2: the outbox, after every lock of step 1. The publisher's
	// INSERTs are queued on the final batch, not sent: they travel in one
	// round trip with step 3 and the COMMIT, in this order, and an error in
	// any of them aborts the transaction before the journal is written.
	final := &pgx.Batch{}
	if err := s.writeOutbox(ctx, batchExecutor{final}, res, lines, p.Commands, eventMD, traceMD); err != nil {
		return core.PostingResult{}, err
	}
	outboxStatements := final.Len()
	if err := queueJournal(final, key, hash, p, res, lines, locked); err != nil {
		return core.PostingResult{}, err
	}
	final.Queue("COMMIT")
	sequence, err := sendFinal(ctx, tx, final, outboxStatements)
	if err != nil {
		return core.PostingResult{}, err
	}
	s.waker.Wake()
	res.Sequence = sequence
	return res, nil
}

// postingPlan is what a posting changes per account, in lock order.
type postingPlan struct {
	// accounts are the posting's accounts sorted by bytes, which gives
	// every transaction the same lock order; bumps[i] is how many lines
	// accounts[i] has (the revisions it takes).
	accounts []string
	bumps    []int64
	counts   map[string]int64
	// The posting's (account, currency) pairs, sorted the same way.
	balAccounts, balCurrencies []string
	journalID                  uuid.UUID
	// postedAt is in microseconds: what timestamptz keeps, so a read-back
	// compares equal.
	postedAt time.Time
}

func planPosting(p core.Posting) (postingPlan, error) {
	journalID, err := uuid.NewV7()
	if err != nil {
		return postingPlan{}, err
	}
	plan := postingPlan{counts: make(map[string]int64), journalID: journalID,
		postedAt: time.Now().UTC().Truncate(time.Microsecond)}
	type balKey struct{ account, currency string }
	deltas := make(map[balKey]int64)
	var balOrder []balKey
	for _, e := range p.Entries {
		plan.counts[e.Account]++
		k := balKey{e.Account, e.Currency}
		if _, ok := deltas[k]; !ok {
			balOrder = append(balOrder, k)
		}
		// Validation bounds each currency's credits and debits by
		// MaxInt64, so a net delta cannot overflow; checked regardless.
		d, ok := addInt64(deltas[k], e.Delta())
		if !ok {
			return postingPlan{}, &core.InputError{Field: "entries", Detail: fmt.Sprintf("the net %s change of account %q overflows a 64-bit integer", e.Currency, e.Account)}
		}
		deltas[k] = d
	}
	for a := range plan.counts {
		plan.accounts = append(plan.accounts, a)
	}
	slices.Sort(plan.accounts)
	plan.bumps = make([]int64, len(plan.accounts))
	for i, a := range plan.accounts {
		plan.bumps[i] = plan.counts[a]
	}
	slices.SortFunc(balOrder, func(a, b balKey) int {
		if c := strings.Compare(a.account, b.account); c != 0 {
			return c
		}
		return strings.Compare(a.currency, b.currency)
	})
	plan.balAccounts = make([]string, len(balOrder))
	plan.balCurrencies = make([]string, len(balOrder))
	for i, k := range balOrder {
		plan.balAccounts[i], plan.balCurrencies[i] = k.account, k.currency
	}
	return plan, nil
}

// lockedAccounts is what step 1 read under the posting's account locks.
type lockedAccounts struct {
	// revision is each account's new revision: its newest plus its lines.
	revision map[string]int64
	// balance is each (account, currency) pair's balance before the posting.
	balance map[[2]string]int64
	// newAccounts and newCurrencies are the pairs the ledger does not have
	// yet (balance 0): the posting adds them.
	newAccounts, newCurrencies []string
}

// lockAccounts is step 1: it creates the missing accounts, locks every
// account of the posting in plan's order, and reads the accounts' newest
// revisions (account_revisions) and balances (account_balances), in one
// round trip. Inserting missing accounts comes before any row lock: an
// insert waits for a concurrent insert of the same ID, and waiting on that
// while holding row locks could deadlock. A pair (account, currency) the
// ledger does not have yet is added by step 3, under the account's lock,
// which every writer of the account's lines holds: no other transaction
// adds it meanwhile.
//
// The same round trip looks digest up among the keys a failover recovery
// restored or recorded lost (posthorn.failover_keys): a retry of a posting
// the old primary committed is answered from there (errRestoredKey, or an
// *core.IdempotencyKeyLostError) and writes nothing, instead of posting
// the money a second time. The table is empty but after a recovery, so
// the probe costs one index lookup.
func lockAccounts(ctx context.Context, tx connTx, plan postingPlan, digest string) (lockedAccounts, error) {
	b := &pgx.Batch{}
	// READ COMMITTED whatever the database's default: the revisions are
	// read after the lock, by a statement whose snapshot holds every line
	// committed before it was granted.
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(`SELECT journal_id::text, restored, reason FROM posthorn.failover_keys WHERE digest = $1 AND expires_at > now()`, digest)
	b.Queue(`INSERT INTO accounts (id) SELECT id FROM unnest($1::text[]) AS u(id) ORDER BY id COLLATE "C" ON CONFLICT DO NOTHING`, plan.accounts)
	b.Queue(`SELECT id FROM accounts WHERE id = ANY($1) ORDER BY id COLLATE "C" FOR UPDATE`, plan.accounts)
	// Nothing of the account is updated: a version per posting would be
	// kept by any long snapshot and walked by every later posting of it.
	// The revisions and balances are read from the newest journal lines.
	b.Queue(`SELECT r.id, r.revision + u.n
FROM unnest($1::text[], $2::bigint[]) AS u(id, n) JOIN account_revisions AS r ON r.id = u.id`, plan.accounts, plan.bumps)
	b.Queue(`SELECT b.account_id, b.currency, b.balance
FROM unnest($1::text[], $2::text[]) AS u(a, c) JOIN account_balances AS b ON b.account_id = u.a AND b.currency = u.c`,
		plan.balAccounts, plan.balCurrencies)
	locked := lockedAccounts{revision: make(map[string]int64, len(plan.accounts)), balance: make(map[[2]string]int64, len(plan.balAccounts))}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return lockedAccounts{}, fmt.Errorf("begin posting: %w", err)
	}
	var journal, reason string
	var restored bool
	switch err := br.QueryRow().Scan(&journal, &restored, &reason); {
	case err == nil && restored:
		return lockedAccounts{}, &restoredKeyError{journalID: journal}
	case err == nil:
		return lockedAccounts{}, &core.IdempotencyKeyLostError{JournalID: journal, Reason: reason}
	case !errors.Is(err, pgx.ErrNoRows):
		return lockedAccounts{}, fmt.Errorf("read the keys a failover recovery restored: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return lockedAccounts{}, fmt.Errorf("create accounts: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return lockedAccounts{}, fmt.Errorf("lock accounts: %w", err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return lockedAccounts{}, fmt.Errorf("lock accounts: %w", err)
	}
	if n != len(plan.accounts) {
		return lockedAccounts{}, fmt.Errorf("lock accounts: locked %d of %d", n, len(plan.accounts))
	}
	rows, err = br.Query()
	if err != nil {
		return lockedAccounts{}, fmt.Errorf("read revisions: %w", err)
	}
	for rows.Next() {
		var id string
		var rev int64
		if err := rows.Scan(&id, &rev); err != nil {
			rows.Close()
			return lockedAccounts{}, fmt.Errorf("read revisions: %w", err)
		}
		locked.revision[id] = rev
	}
	if err := rows.Err(); err != nil {
		return lockedAccounts{}, fmt.Errorf("read revisions: %w", err)
	}
	rows, err = br.Query()
	if err != nil {
		return lockedAccounts{}, fmt.Errorf("read balances: %w", err)
	}
	for rows.Next() {
		var account, currency string
		var balance int64
		if err := rows.Scan(&account, &currency, &balance); err != nil {
			rows.Close()
			return lockedAccounts{}, fmt.Errorf("read balances: %w", err)
		}
		locked.balance[[2]string{account, currency}] = balance
	}
	if err := rows.Err(); err != nil {
		return lockedAccounts{}, fmt.Errorf("read balances: %w", err)
	}
	for i, a := range plan.balAccounts {
		if _, ok := locked.balance[[2]string{a, plan.balCurrencies[i]}]; !ok {
			locked.newAccounts = append(locked.newAccounts, a)
			locked.newCurrencies = append(locked.newCurrencies, plan.balCurrencies[i])
		}
	}
	return locked, br.Close()
}

// assignIDs gives every line its revision, balance and event ID and every
// command its event ID. An account's lines take its new revisions in line
// order, ending at the revision step 1 returned, and its balances in
// line order from the ones step 1 read. A balance leaving the int64 range
// is an *overflowError naming the entry, and nothing is written.
func assignIDs(p core.Posting, plan postingPlan, locked lockedAccounts) (core.PostingResult, []line, error) {
	next := make(map[string]int64, len(locked.revision))
	for a, rev := range locked.revision {
		next[a] = rev - plan.counts[a] + 1
	}
	balance := maps.Clone(locked.balance)
	lines := make([]line, len(p.Entries))
	res := core.PostingResult{
		JournalID: plan.journalID.String(),
		Events:    make([]core.PostedEvent, len(p.Entries)),
		Commands:  make([]core.PostedCommand, len(p.Commands)),
		PostedAt:  plan.postedAt,
	}
	for i, e := range p.Entries {
		id, err := uuid.NewV7()
		if err != nil {
			return core.PostingResult{}, nil, err
		}
		k := [2]string{e.Account, e.Currency}
		b, ok := addInt64(balance[k], e.Delta())
		if !ok {
			return core.PostingResult{}, nil, &overflowError{&core.InputError{Field: fmt.Sprintf("entries[%d].amount", i),
				Detail: fmt.Sprintf("would take the %s balance of account %q beyond the 64-bit range", e.Currency, e.Account)}}
		}
		balance[k] = b
		lines[i] = line{Entry: e, revision: next[e.Account], eventID: id, balanceAfter: b}
		next[e.Account]++
		res.Events[i] = core.PostedEvent{EventID: id.String(), Account: e.Account, Revision: lines[i].revision}
	}
	for i, c := range p.Commands {
		id, err := uuid.NewV7()
		if err != nil {
			return core.PostingResult{}, nil, err
		}
		res.Commands[i] = core.PostedCommand{EventID: id.String(), Type: c.Type}
	}
	return res, lines, nil
}

// queueJournal is step 3: the journal, its lines, the new (account,
// currency) pairs and the idempotency key with the response, in the last
// statement of final.
func queueJournal(final *pgx.Batch, key string, hash [32]byte, p core.Posting, res core.PostingResult, lines []line, locked lockedAccounts) error {
	metadata := p.Metadata
	if metadata == nil {
		metadata = map[string]string{}
	}
	mdJSON, err := json.Marshal(metadata)
	if err != nil {
		return err
	}
	response, err := json.Marshal(res)
	if err != nil {
		return err
	}
	n := len(lines)
	lineNo, lAccount, lDirection, lCurrency := make([]int32, n), make([]string, n), make([]string, n), make([]string, n)
	lAmount, lRevision, lBalance := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, l := range lines {
		lineNo[i], lAccount[i], lDirection[i], lCurrency[i] = int32(i+1), l.Account, string(l.Direction), l.Currency
		lAmount[i], lRevision[i], lBalance[i] = l.Amount, l.revision, l.balanceAfter
	}
	final.Queue(`WITH j AS (
    INSERT INTO journals (id, sequence, metadata, posted_at)
    VALUES ($1::text::uuid, nextval('journal_sequence'), $2::jsonb, $3)
    RETURNING sequence
), l AS (
    INSERT INTO journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision, balance_after)
    SELECT $1::text::uuid, u.* FROM unnest($4::int[], $5::text[], $6::text[], $7::bigint[], $8::text[], $9::bigint[], $10::bigint[]) AS u
), p AS (
    INSERT INTO account_opening_balances (account_id, currency, balance) SELECT *, 0 FROM unnest($14::text[], $15::text[])
)
INSERT INTO idempotency_keys (key, request_hash, journal_id, response)
SELECT $11, $12, $1::text::uuid, jsonb_set($13::jsonb, '{sequence}', to_jsonb(j.sequence)) FROM j
RETURNING (response->>'sequence')::bigint`,
		res.JournalID, string(mdJSON), res.PostedAt,
		lineNo, lAccount, lDirection, lAmount, lCurrency, lRevision, lBalance,
		key, hash[:], string(response), locked.newAccounts, locked.newCurrencies,
	)
	return nil
}

// sendFinal sends steps 2 and 3 and the COMMIT in one round trip and
// returns the journal's sequence, or errKeyTaken when the key was committed
// meanwhile (the insert of the key fails, and with it the transaction).
func sendFinal(ctx context.Context, tx connTx, final *pgx.Batch, outboxStatements int) (int64, error) {
	var sequence int64
	br := tx.SendBatch(ctx, final)
	defer br.Close()
	for i := 0; i < outboxStatements; i++ {
		if _, err := br.Exec(); err != nil {
			return 0, fmt.Errorf("write outbox: %w", err)
		}
	}
	err := br.QueryRow().Scan(&sequence)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "idempotency_keys_pkey" {
		return 0, errKeyTaken
	}
	if err != nil {
		return 0, fmt.Errorf("insert journal: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return 0, fmt.Errorf("commit posting: %w", err)
	}
	return sequence, br.Close()
}

// connTx is the connection a posting's transaction runs on, between the
// BEGIN and the COMMIT it sends itself.
type connTx struct{ *pgx.Conn }

// batchExecutor is what Watermill's SQL publisher writes the outbox
// through: its ExecContext queues the adapter's INSERT on the posting's
// final batch instead of sending it, so the outbox rows cost no round trip
// of their own, and the statement's error surfaces when the batch is sent,
// still inside the transaction, and fails the posting. The publisher only
// executes; a query has nothing to answer from a batch not yet sent, so
// QueryContext refuses.
type batchExecutor struct{ batch *pgx.Batch }

var _ wsql.ContextExecutor = batchExecutor{}

// errQueuedOnly is what a batchExecutor answers where it would need the
// batch's results before the batch is sent.
var errQueuedOnly = errors.New("the outbox executor queues statements on the posting's batch: their results come when the batch is sent")

func (e batchExecutor) ExecContext(_ context.Context, query string, args ...any) (wsql.Result, error) {
	e.batch.Queue(query, args...)
	return queued{}, nil
}

func (batchExecutor) QueryContext(context.Context, string, ...any) (wsql.Rows, error) {
	return nil, errQueuedOnly
}

// queued is the result of a statement queued, not yet sent.
type queued struct{}

func (queued) RowsAffected() (int64, error) { return 0, errQueuedOnly }

// writeOutbox publishes the posting's events and commands through
// Watermill's SQL publisher on exec. Events go in one Publish (one INSERT);
// commands in one Publish per topic, in request order within it. Events
// carry the headers md (allow-listed metadata, the trace context and the
// idempotency digest); commands carry only the trace context, tc.
func (s *Store) writeOutbox(ctx context.Context, exec batchExecutor, res core.PostingResult, lines []line, cmds []core.CommandSpec, md, tc map[string]string) error {
	pub, err := wsql.NewPublisher(exec, wsql.PublisherConfig{SchemaAdapter: s.schema}, s.cfg.Logger)
	if err != nil {
		return fmt.Errorf("outbox publisher: %w", err)
	}
	defer func() { _ = pub.Close() }() // only marks it closed; the tx stays open
	events := make([]*message.Message, len(lines))
	for i, l := range lines {
		payload, err := json.Marshal(core.AccountPosted{
			EventID:   l.eventID.String(),
			JournalID: res.JournalID,
			Account:   l.Account,
			Revision:  l.revision,
			Currency:  l.Currency,
			Delta:     formatDelta(l.Delta()),
			PostedAt:  res.PostedAt,
		})
		if err != nil {
			return err
		}
		env := core.Envelope{
			EventID:       l.eventID.String(),
			Kind:          core.KindEvent,
			Type:          core.TypeAccountPosted,
			Topic:         core.TopicEvents,
			AggregateType: core.AggregateAccount,
			AggregateID:   l.Account,
			Revision:      l.revision,
			JournalID:     res.JournalID,
			OccurredAt:    res.PostedAt,
			SchemaVersion: core.AccountPostedVersion,
			Headers:       md,
			Payload:       payload,
		}
		events[i] = env.ToMessage()
		events[i].SetContext(ctx) // the publisher executes with the first message's context
	}
	if err := pub.Publish(core.TopicEvents, events...); err != nil {
		return fmt.Errorf("write outbox events: %w", err)
	}
	if len(cmds) == 0 {
		return nil
	}
	var topics []string
	byTopic := make(map[string][]*message.Message)
	for i, c := range cmds {
		topic := core.CommandTopic(s.cfg.CommandTopicPrefix, c.Type)
		env := core.Envelope{
			EventID:       res.Commands[i].EventID,
			Kind:          core.KindCommand,
			Type:          c.Type,
			Topic:         topic,
			AggregateType: core.AggregateJournal,
			AggregateID:   res.JournalID,
			// Commands are ordered within their journal: 1..n in request order.
			Revision:   int64(i + 1),
			JournalID:  res.JournalID,
			OccurredAt: res.PostedAt,
			Headers:    tc,
			Payload:    c.Payload,
		}
		msg := env.ToMessage()
		msg.SetContext(ctx)
		if _, ok := byTopic[topic]; !ok {
			topics = append(topics, topic)
		}
		byTopic[topic] = append(byTopic[topic], msg)
	}
	for _, t := range topics {
		if err := pub.Publish(t, byTopic[t]...); err != nil {
			return fmt.Errorf("write outbox commands to %s: %w", t, err)
		}
	}
	return nil
}

// formatDelta renders a signed amount; credit positive.
func formatDelta(d int64) string { return strconv.FormatInt(d, 10) }

func addInt64(a, b int64) (int64, bool) {
	if (b > 0 && a > math.MaxInt64-b) || (b < 0 && a < math.MinInt64-b) {
		return 0, false
	}
	return a + b, true
}

// overflowError is a posting refused because a balance would leave the
// int64 range: a property of the balances now, not of the request, so a
// repeated request is answered from its key first.
type overflowError struct{ input *core.InputError }

func (e *overflowError) Error() string { return e.input.Error() }
func (e *overflowError) Unwrap() error { return e.input }
