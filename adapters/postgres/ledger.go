package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/core"
)

// OutboxMode selects how LedgerStore writes a posting's outbox rows. Only
// OutboxPosthorn is for production; the others exist so the benchmark can
// measure the outbox's cost on the very same write path.
type OutboxMode int

const (
	// OutboxPosthorn writes the outbox table through Watermill's SQL
	// publisher and OutboxSchema. The zero value.
	OutboxPosthorn OutboxMode = iota
	// OutboxNone writes no outbox rows: the "journal alone" baseline.
	// Measurement only: postings written so are never published.
	OutboxNone
	// OutboxWatermillStock writes through watermill-sql's
	// DefaultPostgreSQLSchema into its per-topic tables, which must exist
	// beforehand (StockOutboxTables). Measurement only: the bridge does
	// not read those tables.
	OutboxWatermillStock
)

// LedgerConfig configures a LedgerStore. The zero value is production.
type LedgerConfig struct {
	// CommandTopicPrefix prefixes a command's service in its topic;
	// default core.CommandTopicPrefix ("commands.").
	CommandTopicPrefix string
	// Outbox selects the outbox writer; see OutboxMode.
	Outbox OutboxMode
	// Logger receives Watermill's publisher logs; default none.
	Logger watermill.LoggerAdapter
	// MetadataAllowlist names the posting metadata keys that travel with
	// each of the posting's events, as extra headers MetadataHeaderPrefix +
	// key (never a contract header). Default none: metadata is kept in the
	// journal only. Commands never carry metadata.
	MetadataAllowlist []string
	// MetadataMaxBytes bounds the allow-listed metadata of one posting
	// (keys plus values); above it Post returns a *core.InputError naming
	// "metadata" and writes nothing. Default DefaultMetadataMaxBytes.
	MetadataMaxBytes int
}

// MetadataHeaderPrefix prefixes the header of an allow-listed metadata key
// on the wire, so metadata can never pose as a contract header.
const MetadataHeaderPrefix = "meta_"

// DefaultMetadataMaxBytes is LedgerConfig.MetadataMaxBytes's default.
const DefaultMetadataMaxBytes = 1024

// wireMetadata returns the headers of p's allow-listed metadata (nil when
// none), or an input error when they exceed the size limit.
func (s *LedgerStore) wireMetadata(md map[string]string) (map[string]string, error) {
	if len(s.cfg.MetadataAllowlist) == 0 || len(md) == 0 {
		return nil, nil
	}
	var h map[string]string
	size := 0
	for _, k := range s.cfg.MetadataAllowlist {
		v, ok := md[k]
		if !ok {
			continue
		}
		if h == nil {
			h = make(map[string]string)
		}
		h[MetadataHeaderPrefix+k] = v
		size += len(k) + len(v)
	}
	if size > s.cfg.MetadataMaxBytes {
		return nil, &core.InputError{Field: "metadata", Detail: fmt.Sprintf(
			"the metadata published with the events (keys %v) is %d bytes long, at most %d are allowed",
			s.cfg.MetadataAllowlist, size, s.cfg.MetadataMaxBytes)}
	}
	return h, nil
}

// LedgerStore writes postings and reads them back. It is safe for
// concurrent use; every Post is one transaction on its own connection.
type LedgerStore struct {
	pool   *pgxpool.Pool
	cfg    LedgerConfig
	schema wsql.SchemaAdapter
	waker  *RelayWaker
}

// NewLedgerStore returns a store on pool. The pool should hold at least as
// many connections as concurrent writers (see Connect).
func NewLedgerStore(pool *pgxpool.Pool, cfg LedgerConfig) *LedgerStore {
	if cfg.CommandTopicPrefix == "" {
		cfg.CommandTopicPrefix = core.CommandTopicPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.MetadataMaxBytes <= 0 {
		cfg.MetadataMaxBytes = DefaultMetadataMaxBytes
	}
	s := &LedgerStore{pool: pool, cfg: cfg, waker: NewRelayWaker(pool)}
	switch cfg.Outbox {
	case OutboxPosthorn:
		s.schema = OutboxSchema{}
	case OutboxWatermillStock:
		s.schema = wsql.DefaultPostgreSQLSchema{}
	}
	return s
}

// errKeyTaken means the final insert found the idempotency key taken: the
// transaction is rolled back and the stored response decides the answer.
var errKeyTaken = errors.New("idempotency key taken")

// Post writes p under the idempotency key in one transaction:
//
//  1. create missing accounts, then lock every account of the posting in
//     byte order of its ID (so two postings can never deadlock), bump each
//     account's revision once per line and add the lines' deltas to the
//     balances — one round trip, as a pipelined batch;
//  2. publish one ledger.account.posted event per line and one command per
//     requested command through Watermill's SQL publisher on the same
//     transaction — after step 1, so every outbox row of an account is
//     inserted after that account's row lock (see the package doc);
//  3. insert the journal (taking nextval('journal_sequence') here, in the
//     last statement, so the sequence follows commit order as closely as
//     possible), its lines and the idempotency key with the response.
//
// It returns the result and replayed=false when it committed a new journal.
// When the key exists with the same request (core.PostingHash) it returns
// the stored result and replayed=true, writing nothing; with another
// request, ErrIdempotencyConflict. A balance leaving the int64 range is a
// *core.InputError naming the entry. An error means nothing was written,
// except when the connection fails during COMMIT, where the outcome is
// unknown: a retry with the same key then returns the committed result or
// writes the posting once.
func (s *LedgerStore) Post(ctx context.Context, key string, p core.Posting) (core.PostingResult, bool, error) {
	hash := core.PostingHash(p)
	res, err := s.post(ctx, key, hash, p)
	if err == nil {
		return res, false, nil
	}
	// A repeated request may fail for reasons of today's state (a balance
	// that would now overflow) although it succeeded before: the stored
	// answer wins whenever the key exists.
	if errors.Is(err, errKeyTaken) || isOutOfRange(err) {
		stored, found, lerr := s.lookupKey(ctx, key, hash)
		switch {
		case lerr != nil:
			return core.PostingResult{}, false, lerr
		case found:
			return stored, true, nil
		}
	}
	if isOutOfRange(err) {
		return core.PostingResult{}, false, s.explainOverflow(ctx, p)
	}
	if errors.Is(err, errKeyTaken) {
		// The insert found the key committed, yet the lookup did not: it
		// was deleted in between (an operator's cleanup). Nothing was
		// written; the caller may retry.
		return core.PostingResult{}, false, fmt.Errorf("idempotency key disappeared during the request; retry: %w", err)
	}
	return core.PostingResult{}, false, err
}

// lookupKey reads a stored key: found with the stored result when the hash
// matches, ErrIdempotencyConflict when it does not.
func (s *LedgerStore) lookupKey(ctx context.Context, key string, hash [32]byte) (core.PostingResult, bool, error) {
	var storedHash []byte
	var response []byte
	err := s.pool.QueryRow(ctx, `SELECT request_hash, response FROM idempotency_keys WHERE key = $1`, key).Scan(&storedHash, &response)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.PostingResult{}, false, nil
	}
	if err != nil {
		return core.PostingResult{}, false, fmt.Errorf("read idempotency key: %w", err)
	}
	if string(storedHash) != string(hash[:]) {
		return core.PostingResult{}, false, core.ErrIdempotencyConflict
	}
	var res core.PostingResult
	if err := json.Unmarshal(response, &res); err != nil {
		return core.PostingResult{}, false, fmt.Errorf("stored response of idempotency key: %w", err)
	}
	return res, true, nil
}

// line is one journal line with its place in the account's history.
type line struct {
	core.Entry
	revision int64
	eventID  uuid.UUID
}

func (s *LedgerStore) post(ctx context.Context, key string, hash [32]byte, p core.Posting) (core.PostingResult, error) {
	wireMD, err := s.wireMetadata(p.Metadata)
	if err != nil {
		return core.PostingResult{}, err
	}
	journalID, err := uuid.NewV7()
	if err != nil {
		return core.PostingResult{}, err
	}
	// Microseconds: what timestamptz keeps, so a read-back compares equal.
	postedAt := time.Now().UTC().Truncate(time.Microsecond)

	// Per account: the number of lines (revision bump); per account and
	// currency: the net delta. Accounts sorted by bytes give every
	// transaction the same lock order.
	counts := make(map[string]int64)
	type balKey struct{ account, currency string }
	deltas := make(map[balKey]int64)
	var balOrder []balKey
	for _, e := range p.Entries {
		counts[e.Account]++
		k := balKey{e.Account, e.Currency}
		if _, ok := deltas[k]; !ok {
			balOrder = append(balOrder, k)
		}
		// Validation bounds each currency's credits and debits by
		// MaxInt64, so a net delta cannot overflow; checked regardless.
		d, ok := addInt64(deltas[k], e.Delta())
		if !ok {
			return core.PostingResult{}, &core.InputError{Field: "entries", Detail: fmt.Sprintf("the net %s change of account %q overflows a 64-bit integer", e.Currency, e.Account)}
		}
		deltas[k] = d
	}
	accounts := make([]string, 0, len(counts))
	for a := range counts {
		accounts = append(accounts, a)
	}
	slices.Sort(accounts)
	bumps := make([]int64, len(accounts))
	for i, a := range accounts {
		bumps[i] = counts[a]
	}
	slices.SortFunc(balOrder, func(a, b balKey) int {
		if c := strings.Compare(a.account, b.account); c != 0 {
			return c
		}
		return strings.Compare(a.currency, b.currency)
	})
	balAccounts := make([]string, len(balOrder))
	balCurrencies := make([]string, len(balOrder))
	balDeltas := make([]int64, len(balOrder))
	for i, k := range balOrder {
		balAccounts[i], balCurrencies[i], balDeltas[i] = k.account, k.currency, deltas[k]
	}

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return core.PostingResult{}, fmt.Errorf("begin posting: %w", err)
	}
	// Roll back the raw pgx.Tx: wsql.TxFromPgx(tx).Rollback() panics.
	// After Commit this is a no-op.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// Step 1. Inserting missing accounts comes before any row lock: an
	// insert waits for a concurrent insert of the same ID, and waiting on
	// that while holding row locks could deadlock.
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO accounts (id) SELECT id FROM unnest($1::text[]) AS u(id) ORDER BY id COLLATE "C" ON CONFLICT DO NOTHING`, accounts)
	b.Queue(`SELECT id FROM accounts WHERE id = ANY($1) ORDER BY id COLLATE "C" FOR UPDATE`, accounts)
	b.Queue(`UPDATE accounts AS a SET revision = a.revision + u.n
FROM unnest($1::text[], $2::bigint[]) AS u(id, n) WHERE a.id = u.id
RETURNING a.id, a.revision`, accounts, bumps)
	b.Queue(`INSERT INTO account_balances AS b (account_id, currency, balance)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
ON CONFLICT (account_id, currency) DO UPDATE SET balance = b.balance + EXCLUDED.balance`, balAccounts, balCurrencies, balDeltas)
	newRevision := make(map[string]int64, len(accounts))
	err = func() error {
		br := tx.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("create accounts: %w", err)
		}
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("lock accounts: %w", err)
		}
		locked := 0
		for rows.Next() {
			locked++
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("lock accounts: %w", err)
		}
		if locked != len(accounts) {
			return fmt.Errorf("lock accounts: locked %d of %d", locked, len(accounts))
		}
		rows, err = br.Query()
		if err != nil {
			return fmt.Errorf("bump revisions: %w", err)
		}
		for rows.Next() {
			var id string
			var rev int64
			if err := rows.Scan(&id, &rev); err != nil {
				rows.Close()
				return fmt.Errorf("bump revisions: %w", err)
			}
			newRevision[id] = rev
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("bump revisions: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("update balances: %w", err)
		}
		return br.Close()
	}()
	if err != nil {
		return core.PostingResult{}, err
	}

	// Revisions per line: an account's lines take its new revisions in
	// line order, ending at the revision the update returned.
	next := make(map[string]int64, len(accounts))
	for a, rev := range newRevision {
		next[a] = rev - counts[a] + 1
	}
	lines := make([]line, len(p.Entries))
	res := core.PostingResult{
		JournalID: journalID.String(),
		Events:    make([]core.PostedEvent, len(p.Entries)),
		Commands:  make([]core.PostedCommand, len(p.Commands)),
		PostedAt:  postedAt,
	}
	for i, e := range p.Entries {
		id, err := uuid.NewV7()
		if err != nil {
			return core.PostingResult{}, err
		}
		lines[i] = line{Entry: e, revision: next[e.Account], eventID: id}
		next[e.Account]++
		res.Events[i] = core.PostedEvent{EventID: id.String(), Account: e.Account, Revision: lines[i].revision}
	}

	for i, c := range p.Commands {
		id, err := uuid.NewV7()
		if err != nil {
			return core.PostingResult{}, err
		}
		res.Commands[i] = core.PostedCommand{EventID: id.String(), Type: c.Type}
	}

	// Step 2: the outbox, after every lock of step 1. The publisher's
	// INSERTs are queued on the final batch, not sent: they travel in one
	// round trip with step 3, in this order, and an error in any of them
	// aborts the transaction before the journal is written.
	final := &pgx.Batch{}
	if err := s.writeOutbox(ctx, &pipelinedTx{Tx: tx, batch: final}, res, lines, p.Commands, wireMD); err != nil {
		return core.PostingResult{}, err
	}
	outboxStatements := final.Len()

	// Step 3: journal, lines and key in the last statement.
	metadata := p.Metadata
	if metadata == nil {
		metadata = map[string]string{}
	}
	mdJSON, err := json.Marshal(metadata)
	if err != nil {
		return core.PostingResult{}, err
	}
	response, err := json.Marshal(res)
	if err != nil {
		return core.PostingResult{}, err
	}
	n := len(lines)
	lineNo, lAccount, lDirection, lCurrency := make([]int32, n), make([]string, n), make([]string, n), make([]string, n)
	lAmount, lRevision := make([]int64, n), make([]int64, n)
	for i, l := range lines {
		lineNo[i], lAccount[i], lDirection[i], lCurrency[i] = int32(i+1), l.Account, string(l.Direction), l.Currency
		lAmount[i], lRevision[i] = l.Amount, l.revision
	}
	final.Queue(`WITH j AS (
    INSERT INTO journals (id, sequence, metadata, posted_at)
    VALUES ($1::text::uuid, nextval('journal_sequence'), $2::jsonb, $3)
    RETURNING sequence
), l AS (
    INSERT INTO journal_lines (journal_id, line_no, account_id, direction, amount, currency, revision)
    SELECT $1::text::uuid, u.* FROM unnest($4::int[], $5::text[], $6::text[], $7::bigint[], $8::text[], $9::bigint[]) AS u
)
INSERT INTO idempotency_keys (key, request_hash, journal_id, response)
SELECT $10, $11, $1::text::uuid, jsonb_set($12::jsonb, '{sequence}', to_jsonb(j.sequence)) FROM j
ON CONFLICT (key) DO NOTHING
RETURNING (response->>'sequence')::bigint`,
		res.JournalID, string(mdJSON), postedAt,
		lineNo, lAccount, lDirection, lAmount, lCurrency, lRevision,
		key, hash[:], string(response),
	)
	var sequence int64
	err = func() error {
		br := tx.SendBatch(ctx, final)
		defer br.Close()
		for i := 0; i < outboxStatements; i++ {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("write outbox: %w", err)
			}
		}
		err := br.QueryRow().Scan(&sequence)
		if errors.Is(err, pgx.ErrNoRows) {
			return errKeyTaken
		}
		if err != nil {
			return fmt.Errorf("insert journal: %w", err)
		}
		return br.Close()
	}()
	if err != nil {
		return core.PostingResult{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return core.PostingResult{}, fmt.Errorf("commit posting: %w", err)
	}
	if s.schema != nil {
		s.waker.Wake()
	}
	res.Sequence = sequence
	return res, nil
}

// pipelinedTx is the transaction handed to Watermill's SQL publisher: its
// Exec queues the statement on batch instead of sending it, so the outbox
// INSERTs cost no round trip of their own. The publisher ignores Exec's
// command tag; the statement's error surfaces when the batch is sent, still
// inside the transaction, and fails the posting. Everything else (Query,
// Commit, Rollback) is the real pgx.Tx.
type pipelinedTx struct {
	pgx.Tx
	batch *pgx.Batch
}

func (t *pipelinedTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.batch.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// writeOutbox publishes the posting's events and commands through
// Watermill's SQL publisher on tx. Events go in one Publish (one INSERT);
// commands in one Publish per topic, in request order within it. Events
// carry the allow-listed metadata headers md; commands carry none.
func (s *LedgerStore) writeOutbox(ctx context.Context, tx pgx.Tx, res core.PostingResult, lines []line, cmds []core.CommandSpec, md map[string]string) error {
	if s.schema == nil {
		return nil // OutboxNone: measurement only
	}
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: s.schema}, s.cfg.Logger)
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

// isOutOfRange reports Postgres's numeric_value_out_of_range, which the
// balance upsert raises when a balance would leave the bigint range.
func isOutOfRange(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22003"
}

// explainOverflow turns a rejected balance update into an error naming the
// first entry whose account and currency would overflow. It reads the
// balances after the rollback, so under concurrent writes it may miss; the
// generic detail then still names the field.
func (s *LedgerStore) explainOverflow(ctx context.Context, p core.Posting) error {
	generic := &core.InputError{Field: "entries", Detail: "the posting would take a balance beyond the 64-bit range"}
	rows, err := s.pool.Query(ctx, `SELECT account_id, currency, balance FROM account_balances WHERE account_id = ANY($1)`, accountsOf(p))
	if err != nil {
		return generic
	}
	balances := make(map[[2]string]int64)
	for rows.Next() {
		var a, c string
		var bal int64
		if err := rows.Scan(&a, &c, &bal); err != nil {
			rows.Close()
			return generic
		}
		balances[[2]string{a, c}] = bal
	}
	if rows.Err() != nil {
		return generic
	}
	for i, e := range p.Entries {
		k := [2]string{e.Account, e.Currency}
		v, ok := addInt64(balances[k], e.Delta())
		if !ok {
			return &core.InputError{Field: fmt.Sprintf("entries[%d].amount", i), Detail: fmt.Sprintf("would take the %s balance of account %q beyond the 64-bit range", e.Currency, e.Account)}
		}
		balances[k] = v
	}
	return generic
}

func accountsOf(p core.Posting) []string {
	out := make([]string, 0, len(p.Entries))
	for _, e := range p.Entries {
		out = append(out, e.Account)
	}
	return out
}

// Posting reads a committed posting, or ErrNotFound. journalID must be a
// UUID (the API checks it). The three reads run in one repeatable-read,
// read-only transaction so they see the same commit state.
func (s *LedgerStore) Posting(ctx context.Context, journalID string) (core.CommittedPosting, error) {
	var out core.CommittedPosting
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var md []byte
		err := tx.QueryRow(ctx, `SELECT id::text, sequence, posted_at, metadata FROM journals WHERE id = $1::text::uuid`, journalID).
			Scan(&out.JournalID, &out.Sequence, &out.PostedAt, &md)
		if errors.Is(err, pgx.ErrNoRows) {
			return core.ErrNotFound
		}
		if err != nil {
			return err
		}
		if err := json.Unmarshal(md, &out.Metadata); err != nil {
			return err
		}
		out.PostedAt = out.PostedAt.UTC()
		rows, err := tx.Query(ctx, `SELECT account_id, direction, amount, currency, revision FROM journal_lines WHERE journal_id = $1::text::uuid ORDER BY line_no`, journalID)
		if err != nil {
			return err
		}
		out.Entries, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (core.CommittedLine, error) {
			var l core.CommittedLine
			var amount int64
			err := r.Scan(&l.Account, &l.Direction, &amount, &l.Currency, &l.Revision)
			l.Amount = strconv.FormatInt(amount, 10)
			return l, err
		})
		if err != nil {
			return err
		}
		// Found through the outbox's (aggregate_type, aggregate_id,
		// revision) key: the lines name the events, the journal the commands.
		rows, err = tx.Query(ctx, `SELECT o.event_id::text, o.kind, o.type, o.aggregate_id, o.revision, o.payload
FROM journal_lines l JOIN outbox o ON o.aggregate_type = 'account' AND o.aggregate_id = l.account_id AND o.revision = l.revision
WHERE l.journal_id = $1::text::uuid
UNION ALL
SELECT o.event_id::text, o.kind, o.type, o.aggregate_id, o.revision, o.payload
FROM outbox o WHERE o.aggregate_type = 'journal' AND o.aggregate_id = $2
ORDER BY 5`, journalID, out.JournalID)
		if err != nil {
			return err
		}
		eventOf := make(map[string]string) // account/revision → event ID
		out.Commands = []core.CommittedCommand{}
		for rows.Next() {
			var id, kind, typ, agg string
			var rev int64
			var payload []byte
			if err := rows.Scan(&id, &kind, &typ, &agg, &rev, &payload); err != nil {
				rows.Close()
				return err
			}
			if core.Kind(kind) == core.KindCommand {
				out.Commands = append(out.Commands, core.CommittedCommand{EventID: id, Type: typ, Payload: payload})
			} else {
				eventOf[agg+"\x00"+strconv.FormatInt(rev, 10)] = id
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for i, l := range out.Entries {
			out.Entries[i].EventID = eventOf[l.Account+"\x00"+strconv.FormatInt(l.Revision, 10)]
		}
		return nil
	})
	if err != nil && !errors.Is(err, core.ErrNotFound) {
		return core.CommittedPosting{}, fmt.Errorf("read posting: %w", err)
	}
	return out, err
}

// Account reads an account in one statement (so balances and revision are
// of the same commit), or ErrNotFound.
func (s *LedgerStore) Account(ctx context.Context, id string) (core.Account, error) {
	rows, err := s.pool.Query(ctx, `SELECT a.revision, b.currency, b.balance FROM accounts a
LEFT JOIN account_balances b ON b.account_id = a.id WHERE a.id = $1`, id)
	if err != nil {
		return core.Account{}, fmt.Errorf("read account: %w", err)
	}
	defer rows.Close()
	acc := core.Account{ID: id, Balances: map[string]int64{}}
	found := false
	for rows.Next() {
		var cur *string
		var bal *int64
		if err := rows.Scan(&acc.Revision, &cur, &bal); err != nil {
			return core.Account{}, fmt.Errorf("read account: %w", err)
		}
		found = true
		if cur != nil && bal != nil {
			acc.Balances[*cur] = *bal
		}
	}
	if err := rows.Err(); err != nil {
		return core.Account{}, fmt.Errorf("read account: %w", err)
	}
	if !found {
		return core.Account{}, core.ErrNotFound
	}
	return acc, nil
}

// Ping reports whether the database answers (the API's /readyz).
func (s *LedgerStore) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

var _ api.Store = (*LedgerStore)(nil)
