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
		if secs, ok := ProcessCPU(int(pid)); ok {
			out[int(pid)] = secs
		}
	}
	return out
}

// ProcessCPU returns the user and system time, in seconds, that process
// pid has used so far, from /proc/<pid>/stat; false when there is no such
// process on this machine (it ended, or runs elsewhere).
func ProcessCPU(pid int) (float64, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// Fields after the command name (which may hold spaces): state is
	// field 3, utime 14, stime 15, in USER_HZ ticks (100 on Linux).
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100, true
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
