package integration

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/internal/dev/kfakebroker"
	"github.com/posthorn/posthorn/internal/testkit/childtest"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/syncbuf"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// TestConsumeWaitsForBrokerAtStart: `posthorn consume` started while the
// Kafka broker is down keeps retrying (logged at WARN) instead of exiting,
// and subscribes once the broker comes up. Before the retry it exited with
// status 1 ("cannot subscribe topic ... connection refused"), which the
// fault suite saw as a consumer that "exited on its own".
func TestConsumeWaitsForBrokerAtStart(t *testing.T) {
	bin := posthornBin(t)
	url, _ := pgtest.Consumer(t)
	addr := freeAddr(t) // nothing listens: the broker is down

	var stderr syncbuf.Buffer // the child writes it while the test reads
	cmd := exec.Command(bin, "consume")
	cmd.Env = append(cmd.Environ(), "POSTHORN_CONSUMER__DATABASE__URL="+url,
		"POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS="+addr)
	cmd.Stderr = &stderr
	consume := childtest.Start(t, cmd)

	waitLog := func(what string, n int, d time.Duration) {
		t.Helper()
		wait.ForStatus(t, d, fmt.Sprintf("%q (x%d)", what, n), func() (bool, string) {
			select {
			case <-consume.Exited():
				t.Fatalf("posthorn consume exited (%v) while waiting for %q:\n%s", consume.Err(), what, stderr.String())
			default:
			}
			return strings.Count(stderr.String(), what) >= n, "\n" + stderr.String()
		})
	}
	// Three failed attempts span 0.5 s + 1 s of backoff: the process is
	// still there after the moment it used to exit.
	waitLog("cannot subscribe; broker unreachable? retrying", 3, 30*time.Second)

	b, err := kfakebroker.Start(kfakebroker.Options{Listen: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The first consumer to retry subscribes once the broker is up; the
	// router then starts both handlers.
	waitLog("subscribed after retrying", 1, 60*time.Second)
	waitLog(`"msg":"Starting handler"`, 2, 30*time.Second)

	consume.Term(t, 45*time.Second, &stderr)
}
