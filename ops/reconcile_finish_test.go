package ops

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/uuid"
)

// search finds what a scan of the whole set finds, whatever the position
// it starts from: IDs asked in ascending order (the inbox's), in
// descending order, and at random, present and absent, with the set's
// first and last IDs and IDs beyond both ends among them.
func TestRecordedSetSearchFindsWhatAScanFinds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 100, 1000} {
		var s recordedSet
		var asked []uuid.UUID
		for range n {
			e := recordedEvent{id: randomID(rng), applied: rng.IntN(2) == 0}
			s = append(s, e)
			asked = append(asked, e.id)
		}
		for range n + 3 {
			asked = append(asked, randomID(rng))
		}
		asked = append(asked, uuid.UUID{}, uuid.Max)
		s.sort()
		ascending := append([]uuid.UUID(nil), asked...)
		slices.SortFunc(ascending, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
		descending := make([]uuid.UUID, len(ascending))
		for i, id := range ascending {
			descending[len(ascending)-1-i] = id
		}
		random := append([]uuid.UUID(nil), asked...)
		rng.Shuffle(len(random), func(i, j int) { random[i], random[j] = random[j], random[i] })
		for name, order := range map[string][]uuid.UUID{"ascending": ascending, "descending": descending, "random": random} {
			at := 0
			for _, id := range order {
				i, ok := s.search(id, at)
				want := len(s)
				for k, e := range s {
					if compareRecorded(e, recordedEvent{id: id}) >= 0 {
						want = k
						break
					}
				}
				if i != want || ok != (want < len(s) && s[want].id == id) {
					t.Fatalf("%d events, %s, from %d: %s at %d (found %v), a scan says %d", n, name, at, id, i, ok, want)
				}
				at = i
			}
		}
	}
}

func randomID(rng *rand.Rand) uuid.UUID {
	var id uuid.UUID
	for i := range id {
		id[i] = byte(rng.UintN(256))
	}
	return id
}
