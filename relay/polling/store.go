package polling

import (
	"context"
	"time"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/relay"
)

// Store is what the polling relay needs from the ledger database: the
// outbox reads and parking both modes share (relay.Outbox), its shard
// leases, fenced markers and the notifications of new rows. Every method
// is one short statement or transaction; none holds a transaction across
// calls, and all are safe for concurrent use.
//
// Who may implement it: adapters/postgres/relaystore.Store is the one
// implementation the relay's guarantees are proven against. Another must
// return each shard's rows in the order they were committed, hide none that
// committed, and mark rows only under the lease it was given.
type Store interface {
	relay.Outbox
	ShardLeases
	// MarkRelayed writes the markers of refs, but only in shards whose lease
	// still carries the token in held (fencing); it returns how many rows
	// were marked and how many refused.
	MarkRelayed(ctx context.Context, refs []core.RowRef, held []core.Lease) (marked, refused int, err error)
	// Listen calls notify once it listens for new outbox rows and once per
	// notification, until ctx ends or the connection fails.
	Listen(ctx context.Context, notify func()) error
}

// ShardLeases are the polling relays' shard leases and their membership
// (leases.go): who is live, and which shard each holds under which
// fencing token.
type ShardLeases interface {
	// Heartbeat records owner as live and returns how many relays are live.
	Heartbeat(ctx context.Context, owner string, ttl time.Duration) (int, error)
	// RenewLeases extends the leases owner still holds under the same
	// tokens and returns those; a lease missing from the result was lost.
	RenewLeases(ctx context.Context, owner string, held []core.Lease, ttl time.Duration) ([]core.Lease, error)
	// AcquireLeases takes up to n free or expired shards other than held,
	// each with a new fencing token, never waiting for a contended one.
	AcquireLeases(ctx context.Context, owner string, n int, held []int, ttl time.Duration) ([]core.Lease, error)
	// ReleaseLeases frees the leases owner still holds under their tokens.
	ReleaseLeases(ctx context.Context, owner string, held []core.Lease) error
	// Leave removes owner from the live relays.
	Leave(ctx context.Context, owner string) error
}
