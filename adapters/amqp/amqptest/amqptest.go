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

// Vhost is a vhost of one test on the machine's broker, deleted at
// cleanup; its own name keeps one test's outage from reaching another
// test (of this or another package) running at the same time.
type Vhost struct {
	// URL reaches the vhost as guest.
	URL  string
	name string
}

// NewVhost creates a vhost with guest's permissions.
func NewVhost(t testing.TB) *Vhost {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	v := &Vhost{name: "posthorn-test-" + hex.EncodeToString(b[:])}
	v.URL = "amqp://guest:guest@127.0.0.1:5672/" + v.name
	ctl(t, "add_vhost", v.name)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "-q", "delete_vhost", v.name).Run() })
	ctl(t, "set_permissions", "-p", v.name, "guest", ".*", ".*", ".*")
	return v
}

// Outage withdraws guest's permissions on the vhost and closes its
// connections; the returned function gives the permissions back.
func (v *Vhost) Outage(t testing.TB) (restore func()) {
	t.Helper()
	ctl(t, "clear_permissions", "-p", v.name, "guest")
	ctl(t, "close_all_connections", "-p", v.name, "posthorn test outage")
	return func() { ctl(t, "set_permissions", "-p", v.name, "guest", ".*", ".*", ".*") }
}

func ctl(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
