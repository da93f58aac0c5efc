package polling

import "github.com/posthorn/posthorn/relay/internal/historyhold"

// HistoryGate says whether the ledger runs on the history an operator
// accepted. After a failover to a standby that missed the last postings,
// the new primary reissues outbox ids, journal sequences and revisions
// the world has already seen; publishing from it would hand consumers a
// second event at a revision they applied. adapters/postgres.HistoryWatch
// is the implementation, reading the history on every (re)connect.
type HistoryGate = historyhold.Gate
