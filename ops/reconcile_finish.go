package ops

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/uuid"
)

// finishConsumers completes every consumer's report outside the cut: the
// unrelayed events, the revisions applied twice (read by
// startAppliedTwice) and the unknown event IDs, and whether the report is
// clean. The consumers' inboxes and the outbox are read for every consumer
// concurrently; the archive, last, once for all of them.
func (m *matching) finishConsumers(ctx context.Context) error {
	type finish struct {
		unknown unknownIDs
		err     error
	}
	res := make([]finish, len(m.cfg.Consumers))
	var wg sync.WaitGroup
	for ci := range m.cfg.Consumers {
		wg.Go(func() {
			m.recorded[ci].sort()
			res[ci].unknown, res[ci].err = m.unknownToOutbox(ctx, ci)
		})
	}
	wg.Wait()
	m.twiceRead.Wait()
	for ci, c := range m.cfg.Consumers {
		f, r := res[ci], &m.reps[ci]
		if f.err == nil {
			f.err = m.twice[ci].err
		}
		if f.err != nil {
			return fmt.Errorf("consumer %s: %w", c.Name, f.err)
		}
		for _, g := range m.twice[ci].groups {
			// Report the group by its event of the cut (the ledger's), or
			// by its first ID when none is.
			id, at := g[0], 0
			for _, e := range g {
				if m.recordedInCut(ci, e, true, &at) {
					id = e
					break
				}
			}
			r.Discrepancies.MultipleApplied.add(m.cfg.Cap, id)
		}
		for _, rc := range m.twice[ci].conflicts {
			r.Discrepancies.RevisionConflicts.add(m.cfg.Cap, rc)
		}
	}
	us := make([]unknownIDs, len(res))
	unknown := make([]*Class, len(res))
	for ci := range res {
		us[ci], unknown[ci] = res[ci].unknown, &m.reps[ci].Discrepancies.Unknown
	}
	if err := notArchived(ctx, m.cfg.Archive, us, unknown, m.cfg.Cap); err != nil {
		return err
	}
	for ci := range m.reps {
		m.reps[ci].Clean = m.reps[ci].Discrepancies.total() == 0
	}
	return nil
}

// recordedInCut says whether id, exactly as written, is an event of the
// cut consumer ci had a disposition for (with applied, one it applied).
// The search starts at *at and leaves it where id is or would be (see
// recordedSet.search).
func (m *matching) recordedInCut(ci int, id string, applied bool, at *int) bool {
	// uuid.Parse also reads other spellings; the cut's IDs are canonical.
	k, ok := canonicalUUID(id)
	if !ok {
		return false
	}
	s := m.recorded[ci]
	i, ok := s.search(k, *at)
	*at = i
	return ok && (s[i].applied || !applied)
}

// recordedEvent is an event of the cut that a consumer had a disposition
// for, and whether it applied it.
type recordedEvent struct {
	id      uuid.UUID
	applied bool
}

// recordedSet is one consumer's recordedEvents: appended while the cut is
// matched, sorted by ID (sort) before the first search. A sorted slice,
// not a map: a million events are 17 MB written in order, and the inbox's
// IDs, which arrive in ascending order, are found walking it forward; as a
// map, inserting and finding them took 1.4 s of CPU per million events and
// two consumers.
type recordedSet []recordedEvent

func (s recordedSet) sort() { slices.SortFunc(s, compareRecorded) }

func compareRecorded(a, b recordedEvent) int { return bytes.Compare(a.id[:], b.id[:]) }

// search returns where id is in s, sorted, or would be, and whether it is
// there. It starts from from, the position of the ID searched before, and
// doubles its step: IDs asked in ascending order cost a comparison or two
// each instead of a search of the whole cut. An ID below s[from-1] is
// searched for from the start.
func (s recordedSet) search(id uuid.UUID, from int) (int, bool) {
	key := recordedEvent{id: id}
	lo := 0
	if from > 0 && from <= len(s) && compareRecorded(s[from-1], key) < 0 {
		lo = from
	}
	// Everything below lo is below id; the step ends at one that is not.
	step := 1
	for lo+step <= len(s) && compareRecorded(s[lo+step-1], key) < 0 {
		lo += step
		step *= 2
	}
	i, ok := slices.BinarySearchFunc(s[lo:min(lo+step, len(s))], key, compareRecorded)
	return lo + i, ok
}

// minArchiveCandidates is the least bound on the IDs kept for the archive
// lookup (16 bytes each, 160 MB at it). The IDs a consumer still holds of
// events that cleanup removed are all kept until its inbox retention
// prunes them, which on a busy ledger is millions; they are fewer than the
// outbox ids cleanup removed, so the bound is the greater of the two:
// more IDs than that cannot all be the ledger's.
const minArchiveCandidates = 10_000_000

// unknownIDs are the event IDs a consumer recorded that the outbox does
// not have: the canonical UUIDs, which may be of events cleanup removed
// (sorted, for the archive lookup), and the others, which no event of the
// ledger carries (outbox.event_id is a uuid): counted, the first Cap kept.
type unknownIDs struct {
	candidates []uuid.UUID
	foreign    Class
}

// unknownToOutbox returns consumer ci's event IDs (those changed since its
// mark, or all) that the outbox, read now, does not have. The IDs it had
// recorded for events of the cut are known without asking: only the others
// (for a consumer that is up to date with the cut, hardly any) are looked
// up.
func (m *matching) unknownToOutbox(ctx context.Context, ci int) (unknownIDs, error) {
	var u unknownIDs
	at := 0
	err := m.eventIDs(ctx, ci, func(ids []string) error {
		var ask []string
		for _, id := range ids {
			if !m.recordedInCut(ci, id, false, &at) {
				ask = append(ask, id)
			}
		}
		if len(ask) == 0 {
			return nil
		}
		unknown, err := m.cfg.Ledger.UnknownEventIDs(ctx, ask)
		if err != nil {
			return err
		}
		for _, id := range unknown {
			k, ok := canonicalUUID(id)
			if !ok {
				u.foreign.add(m.cfg.Cap, id)
				continue
			}
			if len(u.candidates) == m.maxCandidates {
				return fmt.Errorf("more than %d event IDs unknown to the outbox, which cleanup has removed fewer from: is this the consumer of this ledger?", m.maxCandidates)
			}
			u.candidates = append(u.candidates, k)
		}
		return nil
	})
	// A store without a unique key may hold an ID twice: it is looked up,
	// and reported, once.
	slices.SortFunc(u.candidates, compareUUID)
	u.candidates = slices.Compact(u.candidates)
	return u, err
}

// canonicalUUID parses id if it is a UUID spelled as the ledger spells
// its event IDs: 36 characters, lower case.
func canonicalUUID(id string) (uuid.UUID, bool) {
	k, err := uuid.Parse(id)
	return k, err == nil && len(id) == 36 && !strings.ContainsAny(id, "ABCDEF")
}

// notArchived adds to each unknown[i] those of us[i]'s candidates that the
// archive, if any, does not have either, and us[i]'s foreign IDs. The
// archive is read once, whatever the number of consumers and candidates.
func notArchived(ctx context.Context, archive ArchiveStore, us []unknownIDs, unknown []*Class, cap int) error {
	found := make([][]bool, len(us))
	some := false
	for i, u := range us {
		unknown[i].Count += u.foreign.Count
		unknown[i].IDs = append(unknown[i].IDs, u.foreign.IDs...)
		found[i] = make([]bool, len(u.candidates))
		some = some || len(u.candidates) > 0
	}
	if some && archive != nil {
		err := ReadArchive(ctx, archive, 0, 1<<63-1, func(r ArchivedRow) error {
			k, ok := canonicalUUID(r.EventID)
			if !ok {
				return nil
			}
			for i, u := range us {
				if j, ok := slices.BinarySearchFunc(u.candidates, k, compareUUID); ok {
					found[i][j] = true
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read the archive for event IDs the outbox no longer has: %w", err)
		}
	}
	for i, u := range us {
		for j, k := range u.candidates {
			if !found[i][j] {
				unknown[i].add(cap, k.String())
			}
		}
	}
	return nil
}

func compareUUID(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }
