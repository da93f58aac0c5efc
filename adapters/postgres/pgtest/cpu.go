package pgtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BackendCPU returns the CPU time, in seconds of user and system time,
// that each PostgreSQL backend the query lists (one column of pids) has
// used so far. It reads /proc/<pid>/stat, so the server must run on this
// machine; a backend that ended meanwhile is left out. CPUSince turns two
// readings into the CPU used between them.
func BackendCPU(t testing.TB, probe *pgxpool.Pool, query string, args ...any) map[int]float64 {
	t.Helper()
	out := map[int]float64{}
	for _, pid := range Column[int32](t, probe, query, args...) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // ended meanwhile
		}
		// Fields after the command name (which may hold spaces): state is
		// field 3, utime 14, stime 15, in USER_HZ ticks (100 on Linux).
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		out[int(pid)] = (u + s) / 100
	}
	return out
}

// CPUSince sums the CPU each backend used from before to after, two
// readings of BackendCPU; a backend that started in between counts from
// zero.
func CPUSince(before, after map[int]float64) float64 {
	var secs float64
	for pid, t := range after {
		secs += t - before[pid]
	}
	return secs
}
