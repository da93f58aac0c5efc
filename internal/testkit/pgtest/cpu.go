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

// MachineCPU returns the whole machine's busy and total time so far, in
// seconds, from the first line of /proc/stat (user nice system idle iowait
// irq softirq steal, in USER_HZ ticks, 100 a second on Linux; guest time is
// already counted in user and nice). Busy leaves out idle and iowait.
func MachineCPU(t testing.TB) (busy, total float64) {
	t.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 {
		t.Fatalf("/proc/stat: %q", line)
	}
	for i, f := range fields[1:9] {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %v", err)
		}
		total += v / 100
		if i != 3 && i != 4 { // idle, iowait
			busy += v / 100
		}
	}
	return busy, total
}
