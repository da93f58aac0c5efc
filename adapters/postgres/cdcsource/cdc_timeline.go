package cdcsource

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/relay/cdc"
)

// Timeline is the timeline of the history the server writes on
// (posthorn.ledger_history's).
func (s *Source) Timeline(ctx context.Context) (int32, error) {
	var tl int32
	if err := s.pool.QueryRow(ctx, `SELECT timeline FROM posthorn.ledger_history()`).Scan(&tl); err != nil {
		return 0, fmt.Errorf("read the ledger's timeline: %w", err)
	}
	return tl, nil
}

// BranchPoint reads the server's timeline history (TIMELINE_HISTORY on a
// replication connection) and returns the WAL position at which it left
// timeline: everything written on timeline past it is not in this
// server's history. 0 when the server still writes on timeline.
func (s *Source) BranchPoint(ctx context.Context, timeline int32) (cdc.LSN, error) {
	current, err := s.Timeline(ctx)
	if err != nil {
		return 0, err
	}
	if current == timeline {
		return 0, nil
	}
	cfg := s.pool.Config().ConnConfig.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = postgres.RelayApplicationName
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("replication connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	h, err := pglogrepl.TimelineHistory(ctx, conn, current)
	if err != nil {
		return 0, fmt.Errorf("timeline history of %d: %w", current, err)
	}
	return branchPoint(h.Content, timeline, current)
}

// branchPoint finds timeline's switchpoint in a timeline history file:
// lines of "parent timeline, switchpoint, reason", tab-separated.
func branchPoint(history []byte, timeline, current int32) (cdc.LSN, error) {
	sc := bufio.NewScanner(bytes.NewReader(history))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		tl, err := strconv.ParseInt(fields[0], 10, 32)
		if err != nil || int32(tl) != timeline {
			continue
		}
		lsn, err := pglogrepl.ParseLSN(fields[1])
		if err != nil {
			return 0, fmt.Errorf("timeline history of %d: switchpoint %q: %w", current, fields[1], err)
		}
		return cdc.LSN(lsn), nil
	}
	return 0, fmt.Errorf("timeline %d is not in the history of timeline %d: the server is not a descendant of the one the relay streamed from", timeline, current)
}
