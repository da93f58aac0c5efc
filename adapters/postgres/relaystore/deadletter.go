package relaystore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/posthorn/posthorn/core"
)

// DeadLettered is what a dead-letter action moved: the parked record's
// event ID, revision and topic.
type DeadLettered struct {
	EventID  string
	Revision int64
	Topic    string
}

// DeadLetter runs posthorn.dead_letter (ledger migration 00013): the
// record the relay parked for the aggregate goes, whole, into the
// dead_letters table with the park's reason, the operator and the time; its
// outbox row becomes a skip marker (core.TypeDeadLettered, same event ID
// and revision) and the park is lifted, all in one transaction, so the relay
// sends the marker in the record's place and the aggregate's later events
// after it. eventID, when not empty, must be the parked record's. With
// audit the decision is also appended to console_audit (the console, which
// audits its actions itself, passes false).
//
// A refusal (not parked, another event ID, no longer unrelayed, no
// operator) is an error that starts with the field's name and changes
// nothing; an aggregate that is not parked matches core.ErrNotParked.
func (s *Store) DeadLetter(ctx context.Context, aggregateType, aggregateID, eventID, operator, remoteAddr string, audit bool) (DeadLettered, error) {
	var id pgtype.UUID
	if eventID != "" {
		if err := id.Scan(eventID); err != nil {
			return DeadLettered{}, fmt.Errorf("event_id: %.80q is not an event ID (a UUID)", eventID)
		}
	}
	var d DeadLettered
	err := s.pool.QueryRow(ctx, `SELECT dead_event_id::text, dead_revision, dead_topic FROM posthorn.dead_letter($1, $2, $3, $4, $5, $6)`,
		aggregateType, aggregateID, id, operator, remoteAddr, audit).Scan(&d.EventID, &d.Revision, &d.Topic)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22023" {
		if strings.Contains(pgErr.Message, "is not parked") {
			return d, fmt.Errorf("%s: %w", pgErr.Message, core.ErrNotParked)
		}
		return d, errors.New(pgErr.Message)
	}
	if err != nil {
		return d, fmt.Errorf("dead-letter %s %s: %w", aggregateType, aggregateID, err)
	}
	return d, nil
}
