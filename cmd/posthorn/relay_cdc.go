package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/cdcsource"
	"github.com/posthorn/posthorn/adapters/postgres/relaystore"
	"github.com/posthorn/posthorn/internal/units"
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
)

// runCDCRelay runs `posthorn relay` with relay.mode cdc: the outbox is
// streamed from a logical replication slot (relay/cdc). The server is
// checked first: wal_level must be logical and the role needs REPLICATION.
// skipPositions is --unsafe-skip-positions (negative controls only).
func runCDCRelay(ctx context.Context, p *prelude, skipPositions bool) error {
	postgres.WarnIfSuperuser(ctx, p.ledger, p.log, "relay", postgres.RoleRelayCDC)
	store := relaystore.New(p.ledger)
	settings := relaySettings(p, store)
	if err := relay.CheckStandbys(ctx, settings.StandbyFlush, p.log); err != nil {
		return fmt.Errorf("config key relay.standby_flush: %w", err)
	}
	r, err := cdc.NewWithHooks(store, cdcsource.New(p.ledger), p.sink, settings, unsafeCDCHooks(skipPositions))
	if err != nil {
		return err
	}
	if err := r.Check(ctx); err != nil {
		return fmt.Errorf("config key relay.mode: cdc: %w", err)
	}
	return serveRelay(ctx, p, r,
		[]any{"mode", "cdc", "owner", r.Owner(), "sink", p.cfg.Sink.Kind, "slot", settings.CDC.Slot},
		"finishing the in-flight batch, confirming its position, releasing the slot lease", "unconfirmed")
}

// unsafeCDCHooks returns the hooks of --unsafe-skip-positions (nil
// without it).
func unsafeCDCHooks(skipPositions bool) *cdc.Hooks {
	if !skipPositions {
		return nil
	}
	return &cdc.Hooks{UnsafeSkipPositions: true}
}

// cdcSlotStatus reads the CDC slot for `outbox status`; nil when there is
// no such slot (polling mode, or CDC never started).
func cdcSlotStatus(ctx context.Context, pool *pgxpool.Pool, slot string) (*cdc.SlotStatus, error) {
	st, err := cdcsource.New(pool).SlotStatus(ctx, slot)
	if err != nil {
		return nil, err
	}
	if !st.Exists {
		return nil, nil
	}
	return &st, nil
}

// printCDCStatus prints the CDC section of `outbox status`: the WAL the
// slot holds back and how close it is to being invalidated.
func printCDCStatus(w io.Writer, st *cdc.SlotStatus) {
	if st == nil {
		return
	}
	fmt.Fprintf(w, "\nCDC slot %s:\n", st.Slot)
	active := "no reader"
	if st.Active {
		active = fmt.Sprintf("streamed by WAL sender pid %d", st.ActivePID)
	}
	fmt.Fprintf(w, "  state: %s, wal_status %s\n", active, st.WALStatus)
	fmt.Fprintf(w, "  retained WAL: %s (pg_current_wal_lsn - restart_lsn); unconfirmed: %s\n",
		units.ByteSize(st.RetainedBytes), units.ByteSize(st.UnconfirmedBytes))
	safe := "unlimited (max_slot_wal_keep_size = -1: a stuck slot can fill the disk; set it)"
	if st.SafeWALSize != nil {
		safe = fmt.Sprintf("%s more WAL before the slot is lost (max_slot_wal_keep_size = %s)", units.ByteSize(*st.SafeWALSize), st.MaxSlotWALKeepSize)
	}
	fmt.Fprintf(w, "  safe WAL size: %s\n", safe)
	if st.FlushLagSeconds != nil {
		fmt.Fprintf(w, "  flush lag: %s\n", time.Duration(*st.FlushLagSeconds*float64(time.Second)).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  confirmed position: %s\n", st.ConfirmedFlushLSN)
	if st.WALStatus == "lost" {
		fmt.Fprintln(w, "  LOST: the server removed WAL this slot needed; the CDC relay recovers through the outbox on its next start")
	}
}
