package ledgerstore

import (
	"maps"
)

// withTrace adds the trace headers tc to md, the posting's own metadata
// headers (wireMetadata makes them per posting, or returns nil).
func withTrace(md, tc map[string]string) map[string]string {
	if md == nil {
		return tc
	}
	maps.Copy(md, tc)
	return md
}
