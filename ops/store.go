package ops

import (
	"context"
	"errors"
	"time"

	"github.com/posthorn/posthorn/core"
)

// The ops store's ports: what each operator's command reads and writes in
// the ledger database (Store, and the narrow port of each operation) and
// in a consumer's inbox (Inbox), and the types they exchange. adapters/postgres/opsstore and adapters/postgres/inboxstore
// implement them, and only they may: a cut's proof, coverage and cleanup's floor are statements about one
// PostgreSQL snapshot of the ledger, which a second implementation would
// have to reproduce exactly for reconcile's verdict to mean anything.

// Store is the operators' whole view of the ledger database: every
// operation's port below, which adapters/postgres/opsstore.Store
// implements and the console passes on. Each operation takes only its own
// (ReconcileStore, ArchiveLedger, CleanupStore, ReplayStore, ResendStore,
// RetentionStore; the failover's is FailoverStore). Every method but
// OpenCut is one short statement or transaction.
type Store interface {
	ReconcileStore
	ArchiveLedger
	CleanupStore
	ReplayStore
	ResendStore
	RetentionStore
}

// ReconcileStore is what Reconcile reads and records in the ledger: the
// cut, the event IDs no outbox row carries, and the consumers' coverage.
type ReconcileStore interface {
	CoverageReader
	// OpenCut proves and opens a cut; it returns ErrCutNotProvable (wrapped,
	// with the reason) when the cut lies beyond the last committed sequence
	// or in-flight transactions did not end within req.Settle.
	OpenCut(ctx context.Context, req CutRequest) (*Cut, error)
	// UnknownEventIDs returns those of ids that no outbox row carries, read
	// now (not in a cut).
	UnknownEventIDs(ctx context.Context, ids []string) ([]string, error)
	// RecordCoverage advances a consumer's verified boundary (never lowers
	// it) and returns the boundary now recorded.
	RecordCoverage(ctx context.Context, consumer string, cut, coveredID int64) (Coverage, error)
	// LedgerHistory names the ledger server's history now (its system and
	// timeline): a consumer's mark proven against another is not used.
	LedgerHistory(ctx context.Context) (string, error)
}

// ArchiveLedger is what Archive reads and records in the ledger: how far
// the consumers' coverage and the archive reach, the rows to archive, and
// each verified segment.
type ArchiveLedger interface {
	CoverageReader
	ArchiveCoverage
	RowReader
	// FirstUnrelayedID is the smallest id of an unrelayed row (0: none).
	FirstUnrelayedID(ctx context.Context) (int64, error)
	// RecordSegment records a verified archive segment; it returns
	// ErrArchiveGap unless the segment starts right after ArchiveThrough.
	RecordSegment(ctx context.Context, seg ArchiveSegment) error
}

// CleanupStore is what Cleanup reads and deletes in the ledger: the
// coverage it may not pass, the archive it verifies first, and the rows.
type CleanupStore interface {
	CoverageReader
	ArchiveCoverage
	SegmentLister
	// PlanCleanup computes the journal floor for rows up to through, capped
	// by maxSequence, and counts the rows eligible outside window.
	PlanCleanup(ctx context.Context, through, maxSequence int64, window time.Duration) (CleanupPlan, error)
	// DeleteBatch deletes up to limit eligible rows of plan with id > after
	// and returns how many and the highest id deleted.
	DeleteBatch(ctx context.Context, plan CleanupPlan, after int64, limit int) (int64, int64, error)
	// RecordCleanup advances the cleanup state.
	RecordCleanup(ctx context.Context, through, floor, deleted int64) error
}

// ReplayStore is what Replay reads and saves in the ledger: what cleanup
// removed (read from the archive instead), the rows, and its progress.
type ReplayStore interface {
	RowReader
	// Cleaned returns the cleanup state (zero before the first cleanup).
	Cleaned(ctx context.Context) (CleanupState, error)
	// CountRows counts the outbox rows matching f.
	CountRows(ctx context.Context, f RowFilter) (int64, error)
	// LoadReplay returns the saved progress of a named replay (found false
	// if none); SaveReplay writes it.
	LoadReplay(ctx context.Context, name string) (ReplayProgress, bool, error)
	SaveReplay(ctx context.Context, p ReplayProgress) error
}

// ResendStore is what Resend reads and marks in the ledger.
type ResendStore interface {
	RowReader
	// MarkResent writes the relay marker of the rows ids a resend got ACKed.
	MarkResent(ctx context.Context, ids []int64) (int, error)
	// FirstUnrelayedBefore returns the aggregate's first unrelayed row with
	// id < beforeID (nil: none).
	FirstUnrelayedBefore(ctx context.Context, aggregateType, aggregateID string, beforeID int64) (*UnrelayedPredecessor, error)
}

// RetentionStore is what Retain prunes in the ledger.
type RetentionStore interface {
	// PruneIdempotencyKeys deletes the Posting API's idempotency keys created
	// before before, in batches of at most batch.
	PruneIdempotencyKeys(ctx context.Context, before time.Time, batch int) (PruneResult, error)
}

// CoverageReader reads every consumer's verified boundary, by name.
type CoverageReader interface {
	Coverages(ctx context.Context) (map[string]Coverage, error)
}

// RowReader reads stored outbox rows.
type RowReader interface {
	// ReadRows returns up to limit outbox rows matching f, in id order.
	ReadRows(ctx context.Context, f RowFilter, limit int) ([]StoredRow, error)
}

// ArchiveCoverage is the recorded archive coverage: every outbox row with
// id <= ArchiveThrough is in a verified segment (0: none).
type ArchiveCoverage interface {
	ArchiveThrough(ctx context.Context) (int64, error)
}

// SegmentLister lists the recorded archive segments in id order (what
// VerifyArchive and VerifyRange hold the archive against).
type SegmentLister interface {
	ArchiveSegments(ctx context.Context) ([]ArchiveSegment, error)
}

// Inbox is what the operators' commands read and prune in a consumer's
// inbox (adapters/postgres/inboxstore.Inbox, through the reconciler's or the
// retention's role).
type Inbox interface {
	// Recorded returns what consumer recorded for each of eventIDs, in
	// their order; the zero Disposition where the inbox has no row.
	Recorded(ctx context.Context, consumer string, eventIDs []string) ([]Disposition, error)
	// InboxEventIDs calls fn with the consumer's recorded event IDs in
	// batches of up to batch.
	InboxEventIDs(ctx context.Context, consumer string, batch int, fn func(ids []string) error) error
	// AppliedTwice returns groups of event IDs applied for the same
	// aggregate revision.
	AppliedTwice(ctx context.Context, consumer string) ([][]string, error)
	// RevisionConflicts returns the consumer's revision_conflict rows.
	RevisionConflicts(ctx context.Context, consumer string) ([]RevisionConflict, error)
	// BeginPass, InboxEventIDsSince, AppliedTwiceSince and RecordMark are
	// IncrementalReader's, for consumer.
	BeginPass(ctx context.Context, consumer, ledgerHistory string) (PassStart, error)
	InboxEventIDsSince(ctx context.Context, consumer string, since uint64, batch int, fn func(ids []string) error) error
	AppliedTwiceSince(ctx context.Context, consumer string, since uint64) ([][]string, error)
	RecordMark(ctx context.Context, consumer string, mark uint64, ledgerHistory, witness string) error
	// Pruned returns which of cands PruneInbox may have removed.
	Pruned(ctx context.Context, consumer string, cands []PrunedCandidate) (map[string]bool, error)
	// PruneInbox deletes the consumer's final rows behind h in batches of at
	// most batch rows.
	PruneInbox(ctx context.Context, consumer string, h InboxHorizon, batch int) (PruneResult, error)
}

// CutReader reads a cut's snapshot (see Cut).
type CutReader interface {
	// LinesWithoutEvents returns up to limit journal lines of the cut
	// (above the floor) that have no event of the same account revision and
	// journal, and how many there are.
	LinesWithoutEvents(ctx context.Context, limit int) ([]JournalLine, int64, error)
	// CoveredOutboxID is the largest outbox id X of a row such that every
	// outbox row with id <= X is final and belongs to the cut: to a journal
	// of the cut, or to none.
	CoveredOutboxID(ctx context.Context) (int64, error)
	// ExpectedEvents calls fn with every row of the cut, in id order, in
	// batches of up to batch: the rows of its journals above the floor, and
	// the rows of no journal (events and commands written by the publish
	// library or the SQL functions) up to CoveredOutboxID. The rows are read
	// as one stream from the snapshot, so fn must not read the cut; an
	// error from fn stops the read and is returned.
	ExpectedEvents(ctx context.Context, batch int, fn func([]ExpectedEvent) error) error
	// LedgerReader opens a reader of the ledger in the same snapshot on a
	// connection of its own (reconcile_ledger.go); it must be called before
	// Close, and lives on after it until its own Close.
	LedgerReader(ctx context.Context) (LedgerReader, error)
	// Close ends the snapshot.
	Close()
}

// ErrCutNotProvable is returned by OpenCut when a cut cannot be proven
// complete: it lies beyond the last committed sequence, or a transaction
// that may still commit a sequence at or below it did not finish in time.
var ErrCutNotProvable = errors.New("cut not provable")

// CutRequest selects a cut. At most one of Sequence and Time is set; none
// means "now": the last committed journal sequence.
type CutRequest struct {
	Sequence int64
	Time     time.Time
	// Settle bounds the wait for in-flight transactions (default 10s).
	Settle time.Duration
}

// Cut is a consistent, provably complete view of the ledger up to journal
// sequence Sequence: every journal with sequence <= Sequence that will ever
// commit is visible in it, and so is every outbox row with id <=
// OutboxIDLimit (adapters/postgres/opsstore.Store.OpenCut says how that is
// proven).
type Cut struct {
	// CutReader reads the cut's snapshot; Close ends it.
	CutReader
	// Sequence is the cut N; LastCommitted is M.
	Sequence      int64
	LastCommitted int64
	// Floor is the cleanup's journal floor: journals at or below it have no
	// outbox rows left and are outside reconciliation.
	Floor int64
	// CleanedThroughID is the cleanup's deleted-through outbox id: rows of
	// no journal at or below it may be gone too.
	CleanedThroughID int64
	// OutboxIDLimit is L: every outbox row with id <= L is final in the cut.
	OutboxIDLimit int64
	// TakenAt is the database time of the snapshot.
	TakenAt time.Time
	// Waited is how long OpenCut waited for in-flight transactions.
	Waited time.Duration
}

// JournalLine names one journal line by its journal and account revision.
type JournalLine struct {
	JournalID string `json:"journal_id"`
	Sequence  int64  `json:"sequence"`
	Account   string `json:"account"`
	Revision  int64  `json:"revision"`
}

// ExpectedEvent is one row of the cut that every consumer subscribing to
// its topic should have.
type ExpectedEvent struct {
	ID      int64
	EventID string
	// Kind (event or command) and Topic route the row to the consumers
	// that subscribe to its topic.
	Kind, Topic string
	// Sequence is the journal's (0: the row belongs to no journal).
	Sequence  int64
	CreatedAt time.Time
	Relayed   bool
	// The aggregate and revision, for telling a pruned inbox row
	// (Inbox.Pruned) from a missing one.
	AggregateType string
	AggregateID   string
	Revision      int64
}

// Coverage is a consumer's last verified boundary.
type Coverage struct {
	Consumer        string    `json:"consumer"`
	CutSequence     int64     `json:"cut_sequence"`
	CoveredOutboxID int64     `json:"covered_outbox_id"`
	VerifiedAt      time.Time `json:"verified_at"`
	// Witness is the random value recorded with this boundary, new on
	// every record: a consumer's mark carries it, and a ledger that holds
	// it holds everything the recording pass proved (failover check).
	Witness string `json:"-"`
}

// StoredRow is one outbox row with everything archive, replay and resend
// need.
type StoredRow struct {
	ID       int64
	Shard    int
	Envelope core.Envelope
	// JournalSequence is 0 for a row without a journal.
	JournalSequence int64
	CreatedAt       time.Time
	Relayed         bool
}

// RowFilter selects outbox rows. Zero fields do not filter.
type RowFilter struct {
	// AfterID and ThroughID bound the outbox id: AfterID < id <= ThroughID
	// (ThroughID 0: no upper bound).
	AfterID, ThroughID int64
	// SequenceFrom and SequenceTo bound the journal sequence (inclusive).
	SequenceFrom, SequenceTo int64
	// From and To bound occurred_at: From <= occurred_at < To.
	From, To time.Time
	// Account keeps only rows of this account.
	Account string
	// EventsOnly drops commands.
	EventsOnly bool
	// RelayedOnly keeps only rows with a marker.
	RelayedOnly bool
	// EventIDs keeps only these event IDs.
	EventIDs []string
}

// UnrelayedPredecessor is an unrelayed row that precedes a row to be resent
// in its aggregate.
type UnrelayedPredecessor struct {
	ID       int64
	EventID  string
	Revision int64
}

// ReplayProgress is a named replay's saved position.
type ReplayProgress struct {
	Name   string
	Spec   []byte
	LastID int64
	Sent   int64
	Done   bool
}

// ArchiveSegment is one archived segment as recorded in the ledger.
type ArchiveSegment struct {
	Segment      string    `json:"segment"`
	FirstID      int64     `json:"first_id"`
	LastID       int64     `json:"last_id"`
	Rows         int64     `json:"rows"`
	FirstEventID string    `json:"first_event_id,omitempty"`
	LastEventID  string    `json:"last_event_id,omitempty"`
	SHA256       string    `json:"sha256"`
	VerifiedAt   time.Time `json:"verified_at"`
}

// ErrArchiveGap is returned by RecordSegment for a segment that does not
// start right after the recorded archive coverage.
var ErrArchiveGap = errors.New("archive segment does not continue the recorded coverage")

// CleanupState is what cleanup has done so far.
type CleanupState struct {
	DeletedThroughID int64     `json:"deleted_through_id"`
	JournalFloor     int64     `json:"journal_floor"`
	DeletedRows      int64     `json:"deleted_rows"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// CleanupPlan is the set of rows a cleanup may delete: rows with
// id <= ThroughID that are relayed, created before Cutoff, and whose
// journal is at or below JournalFloor (or that have none).
type CleanupPlan struct {
	ThroughID    int64     `json:"through_id"`
	Cutoff       time.Time `json:"cutoff"`
	JournalFloor int64     `json:"journal_floor"`
	Rows         int64     `json:"rows"`
	FirstID      int64     `json:"first_id"`
	LastID       int64     `json:"last_id"`
	// InsideWindow counts rows <= ThroughID kept only by the replay window.
	InsideWindow int64 `json:"inside_window"`
}

// InboxHorizon is how far PruneInbox may go for one consumer.
type InboxHorizon struct {
	// Ordered: a final row of an aggregate with a position (an ordered
	// consumer) may go once its revision is below the position's last
	// applied revision (a repeat is then recognised by revision alone) and
	// it was last touched before Ordered.
	Ordered time.Time
	// Unordered: a final row of an aggregate without a position may go once
	// it was last touched before Unordered (the replay window plus a
	// margin: no replay is expected to resend it).
	Unordered time.Time
}

// PruneResult says what one retention run removed.
type PruneResult struct {
	Deleted int64 `json:"deleted"`
	Batches int   `json:"batches"`
}

// PrunedCandidate is an event reconciliation expected and found no inbox
// row for.
type PrunedCandidate struct {
	EventID       string
	AggregateType string
	AggregateID   string
	Revision      int64
	// CreatedAt is the outbox row's: the consumer received it later, so a
	// row last touched before a horizon was created before it too.
	CreatedAt time.Time
}
