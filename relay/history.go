package relay

import "context"

// HistoryGate says whether the ledger runs on the history an operator
// accepted. After a failover to a standby that missed the last postings,
// the new primary reissues outbox ids, journal sequences and revisions
// the world has already seen; publishing from it would hand consumers a
// second event at a revision they applied. adapters/postgres.HistoryWatch
// is the implementation, reading the history on every (re)connect; both
// modes hold publishing while it refuses (relay/internal/historyhold).
type HistoryGate interface {
	// Check returns nil while the history is the accepted one, and an
	// error saying why not otherwise (it may read the history again).
	Check(ctx context.Context) error
}
