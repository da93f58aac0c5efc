package ledgerstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/internal/outboxrow"
	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/core"
)

// Config configures a Store. The zero value is production.
type Config struct {
	// CommandTopicPrefix prefixes a command's service in its topic;
	// default core.CommandTopicPrefix ("commands.").
	CommandTopicPrefix string
	// Logger receives Watermill's publisher logs; default none.
	Logger watermill.LoggerAdapter
	// MetadataAllowlist names the posting metadata keys that travel with
	// each of the posting's events, as extra headers MetadataHeaderPrefix +
	// key (never a contract header). Default none: metadata is kept in the
	// journal only. Commands never carry metadata.
	MetadataAllowlist []string
	// MetadataMaxBytes bounds the allow-listed metadata of one posting
	// (keys plus values); above it Post returns a *core.InputError naming
	// "metadata" and writes nothing. Default core.DefaultMetadataMaxBytes.
	MetadataMaxBytes int
	// History, when set, refuses a posting (an error wrapping
	// core.ErrHistoryNotAccepted, nothing written) while the ledger does
	// not run on the accepted history. It is checked once the posting's
	// connection is acquired: a connection opened to a promoted standby
	// has read the new history (HistoryWatch.Watch) by then, so even the
	// first posting after a failover is refused.
	History *postgres.HistoryWatch
}

// MetadataHeaderPrefix prefixes the header of an allow-listed metadata key
// on the wire, so metadata can never pose as a contract header.
const MetadataHeaderPrefix = outboxrow.MetadataHeaderPrefix

// wireMetadata returns the headers of p's allow-listed metadata (nil when
// none), or an input error when they exceed the size limit.
func (s *Store) wireMetadata(md map[string]string) (map[string]string, error) {
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

// Store writes postings and reads them back. It is safe for
// concurrent use; every Post is one transaction on its own connection.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	// schema is OutboxSchema; the write benchmark swaps it for its
	// baselines.
	schema wsql.SchemaAdapter
	waker  *RelayWaker
}

// New returns a store on pool. The pool should hold at least as
// many connections as concurrent writers (see Connect).
func New(pool *pgxpool.Pool, cfg Config) *Store {
	if cfg.CommandTopicPrefix == "" {
		cfg.CommandTopicPrefix = core.CommandTopicPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	if cfg.MetadataMaxBytes <= 0 {
		cfg.MetadataMaxBytes = core.DefaultMetadataMaxBytes
	}
	return &Store{pool: pool, cfg: cfg, schema: OutboxSchema{}, waker: NewRelayWaker(pool)}
}

// errKeyTaken means the final insert found the idempotency key taken: the
// transaction is rolled back and the stored response decides the answer.
var errKeyTaken = errors.New("idempotency key taken")

// Post writes p under the idempotency key in one transaction:
//
//  1. create missing accounts, then lock every account of the posting in
//     byte order of its ID (so two postings can never deadlock), read each
//     account's newest revision and balances (its lines take the next
//     revisions and carry the balances after them) — one round trip, as a
//     pipelined batch;
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
func (s *Store) Post(ctx context.Context, key string, p core.Posting) (core.PostingResult, bool, error) {
	hash := core.PostingHash(p)
	res, err := s.post(ctx, key, hash, p)
	if err == nil {
		return res, false, nil
	}
	if rk, ok := errors.AsType[*restoredKeyError](err); ok {
		res, err := s.restoredResult(ctx, rk.journalID)
		return res, err == nil, err
	}
	// A repeated request may fail for reasons of today's state (a balance
	// that would now overflow) although it succeeded before: the stored
	// answer wins whenever the key exists.
	overflow, isOverflow := errors.AsType[*overflowError](err)
	if errors.Is(err, errKeyTaken) || isOverflow {
		stored, found, lerr := s.lookupKey(ctx, key, hash)
		switch {
		case lerr != nil:
			return core.PostingResult{}, false, lerr
		case found:
			return stored, true, nil
		}
	}
	if isOverflow {
		return core.PostingResult{}, false, overflow.input
	}
	if errors.Is(err, errKeyTaken) {
		// The insert found the key committed, yet the lookup did not: it
		// was deleted in between (an operator's cleanup). Nothing was
		// written; the caller may retry.
		return core.PostingResult{}, false, fmt.Errorf("idempotency key disappeared during the request; retry: %w", err)
	}
	return core.PostingResult{}, false, err
}

// restoredKeyError means the posting's key was restored by a failover
// recovery: the old primary committed the posting as journalID, and the
// recovery re-committed it.
type restoredKeyError struct{ journalID string }

func (e *restoredKeyError) Error() string {
	return "idempotency key restored by a failover recovery: journal " + e.journalID
}

// restoredResult answers a retry of a key a failover recovery restored:
// the re-committed journal as the ledger holds it now (its sequence
// number is the one the recovery gave it; commands are not re-committed,
// so it lists none).
func (s *Store) restoredResult(ctx context.Context, journalID string) (core.PostingResult, error) {
	p, err := s.Posting(ctx, journalID)
	if err != nil {
		return core.PostingResult{}, fmt.Errorf("read the posting a restored idempotency key names: %w", err)
	}
	res := core.PostingResult{JournalID: p.JournalID, Sequence: p.Sequence, PostedAt: p.PostedAt,
		Events: make([]core.PostedEvent, len(p.Entries)), Commands: make([]core.PostedCommand, len(p.Commands))}
	for i, l := range p.Entries {
		res.Events[i] = core.PostedEvent{EventID: l.EventID, Account: l.Account, Revision: l.Revision}
	}
	for i, c := range p.Commands {
		res.Commands[i] = core.PostedCommand{EventID: c.EventID, Type: c.Type}
	}
	return res, nil
}

// lookupKey reads a stored key: found with the stored result when the hash
// matches, ErrIdempotencyConflict when it does not.
func (s *Store) lookupKey(ctx context.Context, key string, hash [32]byte) (core.PostingResult, bool, error) {
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

// Posting reads a committed posting, or ErrNotFound. journalID must be a
// UUID (the API checks it). The three reads run in one repeatable-read,
// read-only transaction so they see the same commit state.
func (s *Store) Posting(ctx context.Context, journalID string) (core.CommittedPosting, error) {
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
func (s *Store) Account(ctx context.Context, id string) (core.Account, error) {
	rows, err := s.pool.Query(ctx, `SELECT a.revision, b.currency, b.balance FROM account_revisions a
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
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

var _ api.Store = (*Store)(nil)
