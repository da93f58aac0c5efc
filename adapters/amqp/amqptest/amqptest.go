// Package amqptest gives tests the machine's RabbitMQ (127.0.0.1:5672,
// guest/guest): a fresh exchange prefix per test, removed at cleanup, and
// an outage of a vhost of their own: its permissions are withdrawn and its
// connections closed by rabbitmqctl, so clients cannot reconnect until the
// permissions are restored, while every other user of the node goes on.
package amqptest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// SharedURL is the machine's RabbitMQ unless POSTHORN_TEST_AMQP_URL says otherwise.
func SharedURL() string {
	if u := os.Getenv("POSTHORN_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// Prefix returns a fresh exchange prefix ("t<hex>."); at cleanup the
// exchanges of topics and the queues of consumers on them are deleted from
// the broker at url.
func Prefix(t testing.TB, url string, topics, consumers []string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := "t" + hex.EncodeToString(b[:]) + "."
	t.Cleanup(func() {
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for _, tp := range topics {
			for _, c := range consumers {
				_, _ = ch.QueueDelete(p+tp+"_"+c, false, false, false)
			}
			_ = ch.ExchangeDelete(p+tp, false, false)
		}
	})
	return p
}

// OutageVhost is the vhost whose connections Outage cuts.
const OutageVhost = "posthorn-test-outage"

var vhostOnce sync.Once

// OutageURL returns the URL of OutageVhost on the machine's broker,
// creating the vhost with guest's permissions once per process.
func OutageURL(t testing.TB) string {
	t.Helper()
	vhostOnce.Do(func() {
		_ = exec.Command("rabbitmqctl", "-q", "add_vhost", OutageVhost).Run()
	})
	ctl(t, "set_permissions", "-p", OutageVhost, "guest", ".*", ".*", ".*")
	return "amqp://guest:guest@127.0.0.1:5672/" + OutageVhost
}

// Outage withdraws guest's permissions on OutageVhost and closes its
// connections; the returned function gives the permissions back.
func Outage(t testing.TB) (restore func()) {
	t.Helper()
	ctl(t, "clear_permissions", "-p", OutageVhost, "guest")
	ctl(t, "close_all_connections", "-p", OutageVhost, "posthorn test outage")
	return func() { ctl(t, "set_permissions", "-p", OutageVhost, "guest", ".*", ".*", ".*") }
}

func ctl(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
