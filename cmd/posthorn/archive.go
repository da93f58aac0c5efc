package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/posthorn/posthorn/adapters/postgres/opsstore"
	"github.com/posthorn/posthorn/ops"
)

func runArchive(ctx context.Context, args []string) error {
	fs := newFlags("archive", "database.url", "archive.dir")
	verify := fs.Bool("verify", false, "re-read every segment and check checksums, counts, ranges and the ledger's record; write nothing")
	asJSON := fs.Bool("json", false, "print one JSON object")
	p, err := fs.start(ctx, args, needs{ledger: 2, requireArchive: true})
	if err != nil {
		return err
	}
	defer p.close()
	ledger, store := opsstore.New(p.ledger), p.archive
	if *verify {
		res, err := ops.VerifyArchive(ctx, ledger, store)
		if err != nil {
			return err
		}
		if *asJSON {
			_ = json.NewEncoder(os.Stdout).Encode(res)
		} else {
			fmt.Printf("archive %s: %d segments, %d rows, ids through %d\n", p.cfg.Archive.Dir, res.Segments, res.Rows, res.Through)
			for _, problem := range res.Problems {
				fmt.Printf("  PROBLEM: %s\n", problem)
			}
		}
		if len(res.Problems) > 0 {
			return fmt.Errorf("%w: %d problem(s)", ops.ErrArchiveCorrupt, len(res.Problems))
		}
		if !*asJSON {
			fmt.Println("verified: every checksum, count and range matches")
		}
		return nil
	}
	res, err := ops.Archive(ctx, ops.ArchiveConfig{Ledger: ledger, Archive: store, Required: requiredConsumers(p.cfg), SegmentRows: p.cfg.Archive.SegmentRows})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	for _, s := range res.Segments {
		fmt.Printf("segment %s: ids %d..%d, %d rows, sha256 %s\n", s.Name, s.FirstID, s.LastID, s.Rows, s.SHA256)
	}
	fmt.Printf("archive coverage: outbox ids through %d (target %d: the lowest verified consumer coverage, below the first unrelayed row); %d rows archived now\n",
		res.Through, res.Target, res.Rows)
	return nil
}
