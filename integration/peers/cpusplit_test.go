package peers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// The parts of the machine a drain's CPU is split between. The benchmark's
// own process holds the relay (or the ceiling's producer) and the reader
// that times every record; Debezium runs in Kafka Connect's JVM.
const (
	partBench    = "this process"
	partDatabase = "database"
	partBroker   = "broker"
	partConnect  = "Kafka Connect"
	partOther    = "other"
)

var cpuParts = []string{partBench, partDatabase, partBroker, partConnect, partOther}

// cpuSample is every process's CPU so far, and the part it belongs to,
// and the machine's busy time, at one moment.
type cpuSample struct {
	at    time.Time
	pids  map[int]float64 // seconds
	kinds map[int]string
	busy  float64 // seconds of all cores not idle, from /proc/stat
}

// sampleCPU reads /proc. A process that ended between two samples loses
// its CPU from the split (the machine's busy time still has it); every
// part measured here outlives the window it is measured over.
func sampleCPU(b *testing.B) cpuSample {
	s := cpuSample{at: time.Now(), pids: map[int]float64{}, kinds: map[int]string{}}
	s.busy, _ = pgtest.MachineCPU(b)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		secs, ok := pgtest.ProcessCPU(pid)
		if !ok {
			continue
		}
		s.pids[pid], s.kinds[pid] = secs, partOf(pid)
	}
	return s
}

// partOf names the part process pid belongs to.
func partOf(pid int) string {
	if pid == os.Getpid() {
		return partBench
	}
	comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	switch strings.TrimSpace(string(comm)) {
	case "postgres":
		return partDatabase
	case "java":
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		switch {
		case strings.Contains(string(cmdline), "kafka.Kafka"):
			return partBroker
		case strings.Contains(string(cmdline), "ConnectStandalone"):
			return partConnect
		}
	}
	return partOther
}

// cpuUse is what each part used between two samples.
type cpuUse struct {
	elapsed time.Duration
	parts   map[string]float64 // seconds
	busy    float64            // seconds, the whole machine
}

func (s cpuSample) until(after cpuSample) cpuUse {
	u := cpuUse{elapsed: after.at.Sub(s.at), parts: map[string]float64{}, busy: after.busy - s.busy}
	for pid, secs := range after.pids {
		// A process that started in between counts from zero.
		u.parts[after.kinds[pid]] += secs - s.pids[pid]
	}
	return u
}

// String gives each part's CPU in seconds and in cores, and the machine's
// busy cores, over the window.
func (u cpuUse) String() string {
	if u.elapsed <= 0 {
		return "not measured"
	}
	var b strings.Builder
	for _, p := range cpuParts {
		if secs := u.parts[p]; secs >= 0.05 {
			fmt.Fprintf(&b, "%s %.1fs (%.2f cores), ", p, secs, secs/u.elapsed.Seconds())
		}
	}
	fmt.Fprintf(&b, "machine busy %.2f cores", u.busy/u.elapsed.Seconds())
	return b.String()
}

// perEvent is a part's CPU per event, in microseconds.
func (u cpuUse) perEvent(part string, events int) float64 {
	return u.parts[part] / float64(events) * 1e6
}
