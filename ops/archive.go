package ops

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"time"

	"github.com/posthorn/posthorn/core"
)

// ArchiveStore is the port archives are written through: named blobs,
// durable when Put returns. The first adapter is a filesystem directory
// (adapters/fsarchive); object storage fits the same two methods.
type ArchiveStore interface {
	// Put stores data under name, replacing it atomically, and returns only
	// once it is durable (fsynced).
	Put(ctx context.Context, name string, data []byte) error
	// Get returns what is stored under name; a missing name is an error
	// wrapping fs.ErrNotExist.
	Get(ctx context.Context, name string) ([]byte, error)
}

// ManifestName is the manifest's name in the archive store.
const ManifestName = "manifest.json"

// Manifest lists an archive's segments in id order.
type Manifest struct {
	Version  int               `json:"version"`
	Segments []ManifestSegment `json:"segments"`
}

// ManifestSegment describes one segment file: the outbox ids it covers
// (FirstID..LastID, inclusive: ids without a row were never committed), how
// many rows it holds, their event-ID range and the SHA-256 of the file.
type ManifestSegment struct {
	Name         string    `json:"name"`
	FirstID      int64     `json:"first_id"`
	LastID       int64     `json:"last_id"`
	Rows         int64     `json:"rows"`
	Bytes        int64     `json:"bytes"`
	FirstEventID string    `json:"first_event_id,omitempty"`
	LastEventID  string    `json:"last_event_id,omitempty"`
	SHA256       string    `json:"sha256"`
	CreatedAt    time.Time `json:"created_at"`
}

// ArchivedRow is one outbox row in a segment (gzip'd JSON lines).
type ArchivedRow struct {
	ID              int64             `json:"id"`
	EventID         string            `json:"event_id"`
	Kind            core.Kind         `json:"kind"`
	Type            string            `json:"type"`
	Topic           string            `json:"topic"`
	AggregateType   string            `json:"aggregate_type"`
	AggregateID     string            `json:"aggregate_id"`
	Revision        int64             `json:"revision"`
	Shard           int               `json:"shard"`
	JournalID       string            `json:"journal_id,omitempty"`
	JournalSequence int64             `json:"journal_sequence,omitempty"`
	Headers         map[string]string `json:"headers,omitempty"`
	Payload         []byte            `json:"payload"`
	OccurredAt      time.Time         `json:"occurred_at"`
	CreatedAt       time.Time         `json:"created_at"`
	Relayed         bool              `json:"relayed"`
}

func archivedRow(r StoredRow) ArchivedRow {
	e := r.Envelope
	return ArchivedRow{ID: r.ID, EventID: e.EventID, Kind: e.Kind, Type: e.Type, Topic: e.Topic,
		AggregateType: e.AggregateType, AggregateID: e.AggregateID, Revision: e.Revision, Shard: r.Shard,
		JournalID: e.JournalID, JournalSequence: r.JournalSequence, Headers: e.Headers, Payload: e.Payload,
		OccurredAt: e.OccurredAt, CreatedAt: r.CreatedAt, Relayed: r.Relayed}
}

// Stored converts an archived row back into the outbox row it was.
func (a ArchivedRow) Stored() StoredRow {
	return StoredRow{ID: a.ID, Shard: a.Shard, JournalSequence: a.JournalSequence, CreatedAt: a.CreatedAt,
		Relayed: a.Relayed, Envelope: core.Envelope{EventID: a.EventID, Kind: a.Kind, Type: a.Type, Topic: a.Topic,
			AggregateType: a.AggregateType, AggregateID: a.AggregateID, Revision: a.Revision, JournalID: a.JournalID,
			OccurredAt: a.OccurredAt, Headers: a.Headers, Payload: a.Payload}}
}

// Errors of archive, cleanup and replay preconditions.
var (
	// ErrNoCoverage: a required consumer has no verified coverage.
	ErrNoCoverage = errors.New("no verified consumer coverage")
	// ErrArchiveCorrupt: a segment or the manifest does not match.
	ErrArchiveCorrupt = errors.New("archive does not verify")
)

// ArchiveConfig configures Archive.
type ArchiveConfig struct {
	Ledger ArchiveLedger
	// Archive is where the segments and the manifest are written.
	Archive ArchiveStore
	// Required consumers must have verified coverage of every archived row.
	Required []string
	// SegmentRows is the most rows per segment (default DefaultSegmentRows).
	SegmentRows int
}

// ArchiveResult says what Archive wrote.
type ArchiveResult struct {
	// Target is the id archive coverage was to reach; Through what it reached.
	Target   int64             `json:"target"`
	Through  int64             `json:"through"`
	Segments []ManifestSegment `json:"segments"`
	Rows     int64             `json:"rows"`
}

// requiredCoverage returns the lowest verified boundary of the required
// consumers, or ErrNoCoverage naming the first without one.
func requiredCoverage(ctx context.Context, ledger CoverageReader, required []string) (Coverage, error) {
	if len(required) == 0 {
		return Coverage{}, fmt.Errorf("%w: no required consumers configured", ErrNoCoverage)
	}
	covs, err := ledger.Coverages(ctx)
	if err != nil {
		return Coverage{}, err
	}
	var low Coverage
	for i, name := range required {
		c, ok := covs[name]
		if !ok {
			return Coverage{}, fmt.Errorf("%w: consumer %s has no verified coverage (run posthorn reconcile until it is clean)", ErrNoCoverage, name)
		}
		if i == 0 || c.CoveredOutboxID < low.CoveredOutboxID {
			low.CoveredOutboxID = c.CoveredOutboxID
		}
		if i == 0 || c.CutSequence < low.CutSequence {
			low.CutSequence = c.CutSequence
		}
	}
	return low, nil
}

// Archive writes the outbox rows above the archive coverage, up to the
// lowest verified coverage of the required consumers and below the first
// unrelayed row, to segments. Each segment is stored, the manifest updated,
// both read back and checked, and only then recorded in the ledger.
func Archive(ctx context.Context, cfg ArchiveConfig) (ArchiveResult, error) {
	if cfg.SegmentRows <= 0 {
		cfg.SegmentRows = DefaultSegmentRows
	}
	var res ArchiveResult
	low, err := requiredCoverage(ctx, cfg.Ledger, cfg.Required)
	if err != nil {
		return res, err
	}
	target := low.CoveredOutboxID
	first, err := cfg.Ledger.FirstUnrelayedID(ctx)
	if err != nil {
		return res, err
	}
	if first > 0 && first-1 < target {
		target = first - 1
	}
	res.Target = target
	through, err := cfg.Ledger.ArchiveThrough(ctx)
	if err != nil {
		return res, err
	}
	res.Through = through
	m, err := LoadManifest(ctx, cfg.Archive)
	if err != nil {
		return res, err
	}
	for through < target {
		rows, err := cfg.Ledger.ReadRows(ctx, RowFilter{AfterID: through, ThroughID: target}, cfg.SegmentRows)
		if err != nil {
			return res, err
		}
		last := target
		if len(rows) == cfg.SegmentRows {
			last = rows[len(rows)-1].ID
		}
		seg, data, err := encodeSegment(through+1, last, rows)
		if err != nil {
			return res, err
		}
		if err := cfg.Archive.Put(ctx, seg.Name, data); err != nil {
			return res, fmt.Errorf("write segment %s: %w", seg.Name, err)
		}
		// A segment left by an interrupted run at the same start is replaced.
		m.Segments = slices.DeleteFunc(m.Segments, func(s ManifestSegment) bool { return s.FirstID >= seg.FirstID })
		m.Segments = append(m.Segments, seg)
		if err := putManifest(ctx, cfg.Archive, m); err != nil {
			return res, err
		}
		if err := verifySegment(ctx, cfg.Archive, seg); err != nil {
			return res, err
		}
		if err := verifyManifestHas(ctx, cfg.Archive, seg); err != nil {
			return res, err
		}
		if err := cfg.Ledger.RecordSegment(ctx, ArchiveSegment{Segment: seg.Name, FirstID: seg.FirstID,
			LastID: seg.LastID, Rows: seg.Rows, FirstEventID: seg.FirstEventID, LastEventID: seg.LastEventID,
			SHA256: seg.SHA256}); err != nil {
			return res, err
		}
		res.Segments = append(res.Segments, seg)
		res.Rows += seg.Rows
		through = last
		res.Through = through
	}
	return res, nil
}

func segmentName(first, last int64) string {
	return fmt.Sprintf("segment-%020d-%020d.jsonl.gz", first, last)
}

func encodeSegment(first, last int64, rows []StoredRow) (ManifestSegment, []byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	enc := json.NewEncoder(zw)
	for _, r := range rows {
		if err := enc.Encode(archivedRow(r)); err != nil {
			return ManifestSegment{}, nil, fmt.Errorf("encode row %d: %w", r.ID, err)
		}
	}
	if err := zw.Close(); err != nil {
		return ManifestSegment{}, nil, err
	}
	sum := sha256.Sum256(buf.Bytes())
	seg := ManifestSegment{Name: segmentName(first, last), FirstID: first, LastID: last, Rows: int64(len(rows)),
		Bytes: int64(buf.Len()), SHA256: hex.EncodeToString(sum[:]), CreatedAt: time.Now().UTC()}
	if len(rows) > 0 {
		seg.FirstEventID, seg.LastEventID = rows[0].Envelope.EventID, rows[len(rows)-1].Envelope.EventID
	}
	return seg, buf.Bytes(), nil
}

// LoadManifest reads the manifest; a missing one is an empty manifest.
func LoadManifest(ctx context.Context, store ArchiveStore) (Manifest, error) {
	data, err := store.Get(ctx, ManifestName)
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{Version: 1}, nil
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: manifest: %v", ErrArchiveCorrupt, err)
	}
	return m, nil
}

func putManifest(ctx context.Context, store ArchiveStore, m Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := store.Put(ctx, ManifestName, append(data, '\n')); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

func verifyManifestHas(ctx context.Context, store ArchiveStore, seg ManifestSegment) error {
	m, err := LoadManifest(ctx, store)
	if err != nil {
		return err
	}
	for _, s := range m.Segments {
		if s.Name == seg.Name && s.SHA256 == seg.SHA256 && s.Rows == seg.Rows {
			return nil
		}
	}
	return fmt.Errorf("%w: manifest read back lacks segment %s", ErrArchiveCorrupt, seg.Name)
}

// verifySegment re-reads a segment and checks its checksum, row count and
// id range.
func verifySegment(ctx context.Context, store ArchiveStore, seg ManifestSegment) error {
	_, err := readSegment(ctx, store, seg, nil)
	return err
}

// readSegment reads and checks a segment, calling fn (if not nil) per row.
func readSegment(ctx context.Context, store ArchiveStore, seg ManifestSegment, fn func(ArchivedRow) error) (int64, error) {
	data, err := store.Get(ctx, seg.Name)
	if err != nil {
		return 0, fmt.Errorf("%w: segment %s: %v", ErrArchiveCorrupt, seg.Name, err)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != seg.SHA256 {
		return 0, fmt.Errorf("%w: segment %s: SHA-256 %x, manifest says %s", ErrArchiveCorrupt, seg.Name, sum, seg.SHA256)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return 0, fmt.Errorf("%w: segment %s: %v", ErrArchiveCorrupt, seg.Name, err)
	}
	dec := json.NewDecoder(bufio.NewReader(zr))
	var n int64
	prev := seg.FirstID - 1
	for {
		var r ArchivedRow
		err := dec.Decode(&r)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("%w: segment %s row %d: %v", ErrArchiveCorrupt, seg.Name, n+1, err)
		}
		if r.ID <= prev || r.ID > seg.LastID {
			return n, fmt.Errorf("%w: segment %s: row id %d out of order or outside %d..%d", ErrArchiveCorrupt, seg.Name, r.ID, seg.FirstID, seg.LastID)
		}
		prev = r.ID
		n++
		if fn != nil {
			if err := fn(r); err != nil {
				return n, err
			}
		}
	}
	if n != seg.Rows {
		return n, fmt.Errorf("%w: segment %s holds %d rows, manifest says %d", ErrArchiveCorrupt, seg.Name, n, seg.Rows)
	}
	return n, nil
}

// VerifyResult is the outcome of VerifyArchive.
type VerifyResult struct {
	Segments int      `json:"segments"`
	Rows     int64    `json:"rows"`
	Through  int64    `json:"through"`
	Problems []string `json:"problems"`
}

// VerifyArchive re-reads every segment of the manifest and checks its
// checksum, rows and id range, that the segments are contiguous, and that
// every segment the ledger recorded is in the manifest with the same
// checksum. Problems are listed, not returned as an error.
func VerifyArchive(ctx context.Context, ledger SegmentLister, store ArchiveStore) (VerifyResult, error) {
	res := VerifyResult{Problems: []string{}}
	m, err := LoadManifest(ctx, store)
	if err != nil {
		if errors.Is(err, ErrArchiveCorrupt) {
			res.Problems = append(res.Problems, err.Error())
			return res, nil
		}
		return res, err
	}
	bySHA := map[string]string{}
	next := int64(1)
	for _, seg := range m.Segments {
		if seg.FirstID != next {
			res.Problems = append(res.Problems, fmt.Sprintf("segment %s starts at id %d, expected %d", seg.Name, seg.FirstID, next))
		}
		next = seg.LastID + 1
		n, err := readSegment(ctx, store, seg, nil)
		if err != nil {
			res.Problems = append(res.Problems, err.Error())
		}
		res.Segments++
		res.Rows += n
		res.Through = seg.LastID
		bySHA[seg.Name] = seg.SHA256
	}
	recorded, err := ledger.ArchiveSegments(ctx)
	if err != nil {
		return res, err
	}
	for _, r := range recorded {
		sha, ok := bySHA[r.Segment]
		switch {
		case !ok:
			res.Problems = append(res.Problems, fmt.Sprintf("segment %s is recorded in the ledger but missing from the manifest", r.Segment))
		case sha != r.SHA256:
			res.Problems = append(res.Problems, fmt.Sprintf("segment %s: ledger records SHA-256 %s, manifest %s", r.Segment, r.SHA256, sha))
		}
	}
	return res, nil
}

// VerifyRange checks the archive segments that the ledger recorded as
// covering outbox ids firstID..lastID, the way VerifyArchive checks every
// segment: the recorded segments are contiguous over the range, each is in
// the manifest with the checksum and row count the ledger recorded, and its
// file is present, hashes to that checksum and holds exactly those rows in
// its id range. Cleanup calls it before deleting: it deletes only rows it
// can still read back. Problems are listed, not returned as an error.
func VerifyRange(ctx context.Context, ledger SegmentLister, store ArchiveStore, firstID, lastID int64) ([]string, error) {
	problems := []string{}
	recorded, err := ledger.ArchiveSegments(ctx)
	if err != nil {
		return problems, err
	}
	m, err := LoadManifest(ctx, store)
	if err != nil {
		if errors.Is(err, ErrArchiveCorrupt) {
			return append(problems, err.Error()), nil
		}
		return problems, err
	}
	inManifest := make(map[string]ManifestSegment, len(m.Segments))
	for _, seg := range m.Segments {
		inManifest[seg.Name] = seg
	}
	next := firstID
	for _, r := range recorded {
		if r.LastID < firstID || r.FirstID > lastID {
			continue
		}
		if r.FirstID > next {
			problems = append(problems, fmt.Sprintf("no recorded segment covers outbox ids %d..%d", next, r.FirstID-1))
		}
		next = max(next, r.LastID+1)
		seg, ok := inManifest[r.Segment]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("segment %s is recorded in the ledger but missing from the manifest", r.Segment))
			continue
		case seg.SHA256 != r.SHA256:
			problems = append(problems, fmt.Sprintf("segment %s: ledger records SHA-256 %s, manifest %s", r.Segment, r.SHA256, seg.SHA256))
			continue
		case seg.Rows != r.Rows || seg.FirstID != r.FirstID || seg.LastID != r.LastID:
			problems = append(problems, fmt.Sprintf("segment %s: ledger records ids %d..%d with %d rows, manifest ids %d..%d with %d rows",
				r.Segment, r.FirstID, r.LastID, r.Rows, seg.FirstID, seg.LastID, seg.Rows))
			continue
		}
		if _, err := readSegment(ctx, store, seg, nil); err != nil {
			if !errors.Is(err, ErrArchiveCorrupt) {
				return problems, err
			}
			problems = append(problems, err.Error())
		}
	}
	if next <= lastID {
		problems = append(problems, fmt.Sprintf("no recorded segment covers outbox ids %d..%d", next, lastID))
	}
	return problems, nil
}

// ReadArchive calls fn for every archived row with afterID < id <= throughID,
// in id order, verifying each segment it opens.
func ReadArchive(ctx context.Context, store ArchiveStore, afterID, throughID int64, fn func(ArchivedRow) error) error {
	m, err := LoadManifest(ctx, store)
	if err != nil {
		return err
	}
	for _, seg := range m.Segments {
		if seg.LastID <= afterID || seg.FirstID > throughID {
			continue
		}
		if _, err := readSegment(ctx, store, seg, func(r ArchivedRow) error {
			if r.ID <= afterID || r.ID > throughID {
				return nil
			}
			return fn(r)
		}); err != nil {
			return err
		}
	}
	return nil
}
