// Package amqptest gives tests RabbitMQ in three ways:
//   - the machine's node (127.0.0.1:5672, guest/guest) with a fresh exchange
//     prefix per test, removed at cleanup (Prefix);
//   - a dedicated node of one test (StartNode): its own rabbitmq-server on
//     free ports with its data, logs and Erlang cookie in a temp dir, which
//     the test may kill (SIGKILL, a crash) or stop and start again on the
//     same data directory, so durable queues and the persistent messages
//     they confirmed are found again, while the machine's node and every
//     other test on it go on;
//   - where no dedicated node can be started (NodeUnavailable), a vhost of
//     one test on the machine's node whose permissions are withdrawn and
//     whose connections are closed: a simulated outage that proves
//     reconnection but not the broker's durability.
package amqptest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	phamqp "github.com/posthorn/posthorn/adapters/amqp"
	"github.com/posthorn/posthorn/internal/testkit/servertest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// SharedURL is the machine's RabbitMQ unless POSTHORN_TEST_AMQP_URL says otherwise.
func SharedURL() string {
	return servertest.Getenv("POSTHORN_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
}

// Prefix returns a fresh exchange prefix ("t<hex>."); at cleanup the
// exchanges of topics and the queues of consumers on them are deleted from
// the broker at url.
func Prefix(t testing.TB, url string, topics, consumers []string) string {
	return servertest.Prefix(t, func(p string) {
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		names := phamqp.Topology{ExchangePrefix: p}
		for _, tp := range topics {
			for _, c := range consumers {
				_, _ = ch.QueueDelete(names.Queue(tp, c), false, false, false)
			}
			_ = ch.ExchangeDelete(names.Exchange(tp), false, false)
		}
	})
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
	v := &Vhost{name: servertest.Name("posthorn-test-")}
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

// rabbitBin is where the real rabbitmq-server and rabbitmqctl scripts are.
// Debian's /usr/sbin ones are wrappers that su to the rabbitmq user (who
// cannot read a test's temp dir) and send the server's output to the
// machine node's /var/log/rabbitmq/startup_log.
func rabbitBin() (string, error) {
	if _, err := os.Stat("/usr/lib/rabbitmq/bin/rabbitmq-server"); err == nil {
		return "/usr/lib/rabbitmq/bin", nil
	}
	p, err := exec.LookPath("rabbitmq-server")
	if err != nil {
		return "", err
	}
	return filepath.Dir(p), nil
}

// NodeUnavailable says why StartNode cannot run here ("" when it can):
// RabbitMQ's server scripts are not installed.
func NodeUnavailable() string {
	if _, err := rabbitBin(); err != nil {
		return "rabbitmq-server not installed (apt-get install rabbitmq-server): " + err.Error()
	}
	return ""
}

// Node is a dedicated RabbitMQ node of one test. The node runs as the test's
// user with HOME in its temp dir, where Erlang creates the node's own
// cookie; rabbitmqctl is run with the same HOME, so no cookie is shared with
// (or read from) the machine's node. It registers its name with the
// machine's epmd (127.0.0.1:4369), which is how rabbitmqctl finds it.
type Node struct {
	// URL reaches the node's default vhost as guest (allowed from loopback).
	URL string
	// Name is the Erlang node name, posthorn-test-<hex>@localhost.
	Name string
	t    testing.TB
	bin  string
	dir  string
	env  []string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// StartNode starts a dedicated node and waits until it accepts AMQP
// connections; it is killed at cleanup. It fails the test when the node
// does not come up (see NodeUnavailable to choose another outage first).
func StartNode(t testing.TB) *Node {
	t.Helper()
	bin, err := rabbitBin()
	if err != nil {
		t.Fatalf("amqptest: %s", NodeUnavailable())
	}
	dir := t.TempDir()
	n := &Node{t: t, bin: bin, dir: dir, Name: servertest.Name("posthorn-test-") + "@localhost"}
	amqpPort, distPort := servertest.FreePort(t), servertest.FreePort(t)
	n.URL = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort)
	for name, text := range map[string]string{
		// Without files of its own the node would read the machine's
		// /etc/rabbitmq ones: the env file names it rabbit@localhost and the
		// config binds port 5672, both the machine node's.
		"rabbitmq-env.conf": "# deliberately empty: not /etc/rabbitmq/rabbitmq-env.conf\n",
		"rabbitmq.conf":     "# deliberately minimal: not /etc/rabbitmq/rabbitmq.conf (its listener is the machine node's)\nloopback_users.guest = true\n",
		// No plugins: the management plugin would bind the machine node's
		// port 15672.
		"enabled_plugins": "[].\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RABBITMQ_") && !strings.HasPrefix(kv, "ERL_") && !strings.HasPrefix(kv, "HOME=") {
			n.env = append(n.env, kv)
		}
	}
	n.env = append(n.env,
		"HOME="+filepath.Join(dir, "home"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_NODENAME="+n.Name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
		// The default (node port + 20000) may be anyone's.
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "node.pid"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_EPMD_ADDRESS=127.0.0.1",
	)
	t.Cleanup(n.Kill)
	n.StartAgain()
	return n
}

// StartAgain starts the node (after Kill or Stop) on its ports and data
// directory and returns when it accepts AMQP connections: RabbitMQ opens
// its listener only after it has recovered its durable queues and their
// messages. The time it took is logged.
func (n *Node) StartAgain() {
	n.t.Helper()
	began := time.Now()
	out, err := os.OpenFile(filepath.Join(n.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		n.t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(filepath.Join(n.bin, "rabbitmq-server"))
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = n.env, n.dir, out, out
	// A group of its own, so Kill reaches the beam process and its port
	// programs, not just the script that started them.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("amqptest: start rabbitmq-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	// err is the last dial's.
	up := wait.Until(90*time.Second, func() (bool, string) {
		var conn *amqp.Connection
		if conn, err = amqp.DialConfig(n.URL, amqp.Config{Dial: amqp.DefaultDial(500 * time.Millisecond)}); err == nil {
			_ = conn.Close()
			return true, ""
		}
		select {
		case <-done:
			n.t.Fatalf("amqptest: rabbitmq-server exited while starting (%v); its output ends:\n%s", cmd.ProcessState, n.outputTail())
		default:
		}
		return false, ""
	})
	if !up {
		n.Kill()
		n.t.Fatalf("amqptest: node %s did not accept connections within 90 s: %v; its output ends:\n%s", n.Name, err, n.outputTail())
	}
	n.t.Logf("amqptest: node %s accepts connections at %s after %v", n.Name, strings.TrimSuffix(n.URL[strings.LastIndex(n.URL, "@")+1:], "/"), time.Since(began).Round(10*time.Millisecond))
}

// Kill ends the node with SIGKILL to its process group, as a crash would:
// what it had not written to disk is gone; a message it confirmed was.
func (n *Node) Kill() {
	if n.cmd == nil {
		return
	}
	select {
	case <-n.done:
	default:
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
	n.cmd = nil
}

// Stop shuts the node down cleanly (rabbitmqctl stop), as an operator's
// restart would; it kills the node if it has not exited within 60 s.
func (n *Node) Stop() {
	n.t.Helper()
	if n.cmd == nil {
		return
	}
	if out, err := n.ctl("stop"); err != nil {
		n.t.Logf("amqptest: rabbitmqctl stop: %v: %s; killing the node", err, out)
		n.Kill()
		return
	}
	select {
	case <-n.done:
	case <-time.After(60 * time.Second):
		n.t.Logf("amqptest: node %s still running 60 s after rabbitmqctl stop; killing it", n.Name)
	}
	n.Kill()
}

// ctl runs rabbitmqctl against the node with the node's HOME (its cookie).
func (n *Node) ctl(args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(n.bin, "rabbitmqctl"), append([]string{"-q", "-n", n.Name}, args...)...)
	cmd.Env, cmd.Dir = n.env, n.dir
	return cmd.CombinedOutput()
}

func (n *Node) outputTail() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
