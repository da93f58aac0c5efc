package faultkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/posthorn/posthorn/adapters/kafka/kafkagroup"
	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/adapters/postgres/ledgerstore"
	"github.com/posthorn/posthorn/consumers"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
	"github.com/posthorn/posthorn/internal/testkit/netfault"
)

// Application names the suite gives its own sessions and the consumers'
// (the relay sets postgres.RelayApplicationName itself).
const (
	consumerAppName = "posthorn-consume"
	faultAppName    = "posthorn-fault"
)

// SystemConfig describes the processes of one run.
type SystemConfig struct {
	// Bin is the posthorn binary (Build).
	Bin string
	// LedgerURL and ConsumerURL are migrated databases.
	LedgerURL, ConsumerURL string
	// Dir holds the logs and the broker's data directory.
	Dir string
	// Relays and Consumers are the instance counts (default 2 each).
	Relays, Consumers int
	// LeaseTTL of the relays (default 2 s), so a frozen relay loses its
	// shards quickly.
	LeaseTTL time.Duration
	// BrokerNodes is the size of the Kafka-protocol cluster (`posthorn dev
	// kafka --nodes`, default 1); with more than one, MoveLeaders elects
	// new partition leaders.
	BrokerNodes int
	// StaticMembers gives consumer N the instance ID consumer-N
	// (consumer.instance_id): restarted, it takes its partitions back
	// without waiting for its dead member's session and a rebalance.
	StaticMembers bool
	// UnsafeNoInbox and UnsafeMarkBeforeAck switch a protection off for a
	// negative control.
	UnsafeNoInbox, UnsafeMarkBeforeAck bool
	// ExactlyOnce runs the relays with sink.kafka.exactly_once (the
	// consumers read as always: read_uncommitted, behind the inbox).
	ExactlyOnce bool
	// BrokerStopsCleanly makes a broker outage a SIGTERM (the dev broker
	// shuts down, finishing what it was writing) instead of a SIGKILL. The
	// exactly-once runs need it: after a SIGKILL the dev broker (kfake)
	// recovers transactions that were open or committing as it sees fit,
	// which a real Kafka broker does from its transaction log (see
	// docs/sinks.md).
	BrokerStopsCleanly bool
	// Kafka, when set, is a real Apache Kafka cluster the run uses instead
	// of the dev broker: a broker outage SIGKILLs one of its nodes (in
	// turn) and restarts it on its data directory, and MoveLeaders makes
	// the next replica of every partition of the event topic its
	// preferred leader and elects it (BrokerStopsCleanly does not apply).
	Kafka *kafkacluster.Cluster
	// Format is the relays' sink.format (empty: the default, posthorn).
	Format string
	// RelayMode is the relays' relay.mode: empty (polling) or "cdc", for
	// which LedgerURL must be a database with wal_level=logical.
	RelayMode string
	// RelayArgs and ConsumerArgs are added to the relays' and consumers'
	// command lines, RelayEnv to the relays' environment (after the
	// suite's own, so it wins).
	RelayArgs, ConsumerArgs, RelayEnv []string
	// RelayEnvEach adds to one relay's environment, by name (relay-A).
	RelayEnvEach map[string][]string
	// Users gives processes, by name (relay-A, consumer-1), a Unix user of
	// their own, so that a partition can cut their links (netfault); Bin
	// must then lie where those users can reach it (ExposeDir).
	Users map[string]netfault.User
}

// System is the running set of processes plus the suite's own pools.
type System struct {
	cfg        SystemConfig
	Broker     *Proc
	API        *Proc
	Relays     []*Proc
	Consumers  []*Proc
	BrokerAddr string
	// Brokers are the bootstrap servers of the cluster the processes use.
	Brokers []string
	APIURL  string
	// Ledger and Consumer are the suite's pools (application name
	// posthorn-fault, never terminated by the faults).
	Ledger, Consumer *pgxpool.Pool
	store            *ledgerstore.Store
	// outages counts the broker outages, to pick the next node of Kafka.
	outages atomic.Int64
}

// faultHooks is installed on the ledger database of a fault run only. An
// AFTER INSERT trigger on journals runs inside the posting transaction,
// after the write path has locked the accounts and inserted the outbox
// rows, so it can hold that transaction open (metadata fault_hold_seconds)
// or roll it back (metadata fault_rollback), naming the outbox event IDs
// the transaction wrote in the error. The suite posts such postings through
// ledgerstore.Store — the very write path of the API — so the
// lock-then-insert invariant holds as in production.
const faultHooks = `
CREATE OR REPLACE FUNCTION posthorn_fault_hook() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.metadata ? 'fault_hold_seconds' THEN
        PERFORM pg_sleep((NEW.metadata->>'fault_hold_seconds')::float8);
    END IF;
    IF NEW.metadata ? 'fault_rollback' THEN
        RAISE EXCEPTION 'posthorn-fault-rollback events=%',
            (SELECT string_agg(event_id::text, ',') FROM outbox WHERE journal_id = NEW.id);
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS posthorn_fault_hook ON journals;
CREATE TRIGGER posthorn_fault_hook AFTER INSERT ON journals FOR EACH ROW EXECUTE FUNCTION posthorn_fault_hook();
`

// StartSystem starts the broker, the API, the relays and the consumers and
// returns once each is up. Close stops them.
func StartSystem(ctx context.Context, cfg SystemConfig) (*System, error) {
	if cfg.Relays == 0 {
		cfg.Relays = 2
	}
	if cfg.Consumers == 0 {
		cfg.Consumers = 2
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	s := &System{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	var err error
	if s.Ledger, err = postgres.Connect(ctx, WithAppName(cfg.LedgerURL, faultAppName), 8); err != nil {
		return nil, err
	}
	if s.Consumer, err = postgres.Connect(ctx, WithAppName(cfg.ConsumerURL, faultAppName), 4); err != nil {
		return nil, err
	}
	if _, err := s.Ledger.Exec(ctx, faultHooks); err != nil {
		return nil, fmt.Errorf("install fault hooks: %w", err)
	}
	s.store = ledgerstore.New(s.Ledger, ledgerstore.Config{})

	apiPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	s.APIURL = fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	if cfg.Kafka != nil {
		s.Brokers = cfg.Kafka.Brokers
		s.BrokerAddr = s.Brokers[0]
	} else if err := s.startDevBroker(ctx); err != nil {
		return nil, err
	}
	brokers := s.Brokers
	s.API = NewProc(ProcConfig{Name: "api", Bin: cfg.Bin, LogDir: cfg.Dir,
		Args:  []string{"api", "--api.listen", fmt.Sprintf("127.0.0.1:%d", apiPort)},
		Env:   []string{"POSTHORN_DATABASE__URL=" + cfg.LedgerURL, "POSTHORN_LOG__LEVEL=warn"},
		Ready: HTTPReady(s.APIURL + "/readyz")})
	if err := s.API.Start(ctx); err != nil {
		return nil, err
	}
	sinkEnv := []string{"POSTHORN_SINK__KIND=kafka", "POSTHORN_SINK__KAFKA__BROKERS=" + strings.Join(brokers, ",")}
	if cfg.ExactlyOnce {
		sinkEnv = append(sinkEnv, "POSTHORN_SINK__KAFKA__EXACTLY_ONCE=true")
	}
	if cfg.Format != "" {
		sinkEnv = append(sinkEnv, "POSTHORN_SINK__FORMAT="+cfg.Format)
	}
	for i := 0; i < cfg.Relays; i++ {
		args := []string{"relay"}
		if cfg.UnsafeMarkBeforeAck {
			args = append(args, "--unsafe-mark-before-ack")
		}
		args = append(args, cfg.RelayArgs...)
		name := fmt.Sprintf("relay-%c", 'A'+i)
		env := append([]string{"POSTHORN_DATABASE__URL=" + cfg.LedgerURL,
			"POSTHORN_RELAY__OWNER=" + name,
			"POSTHORN_RELAY__LEASE_TTL=" + cfg.LeaseTTL.String(),
			"POSTHORN_RELAY__POLL_INTERVAL=200ms"}, sinkEnv...)
		if cfg.RelayMode != "" {
			env = append(env, "POSTHORN_RELAY__MODE="+cfg.RelayMode)
		}
		p := NewProc(ProcConfig{Name: name, Bin: cfg.Bin, LogDir: cfg.Dir, Args: args,
			Env: append(append(env, cfg.RelayEnv...), cfg.RelayEnvEach[name]...), User: cfg.Users[name]})
		if err := p.Start(ctx); err != nil {
			return nil, err
		}
		s.Relays = append(s.Relays, p)
	}
	for i := 0; i < cfg.Consumers; i++ {
		args := []string{"consume"}
		if cfg.UnsafeNoInbox {
			args = append(args, "--unsafe-no-inbox")
		}
		args = append(args, cfg.ConsumerArgs...)
		name := fmt.Sprintf("consumer-%d", i+1)
		env := append([]string{"POSTHORN_CONSUMER__DATABASE__URL=" + WithAppName(cfg.ConsumerURL, fmt.Sprintf("%s-%d", consumerAppName, i+1))}, sinkEnv...)
		if cfg.StaticMembers {
			env = append(env, "POSTHORN_CONSUMER__INSTANCE_ID="+name)
		}
		p := NewProc(ProcConfig{Name: name, Bin: cfg.Bin, LogDir: cfg.Dir, Args: args, Env: env, User: cfg.Users[name]})
		if err := p.Start(ctx); err != nil {
			return nil, err
		}
		s.Consumers = append(s.Consumers, p)
	}
	ok = true
	return s, nil
}

// startDevBroker starts `posthorn dev kafka` with cfg.BrokerNodes nodes.
func (s *System) startDevBroker(ctx context.Context) error {
	nodes := max(1, s.cfg.BrokerNodes)
	brokerPort, err := freePorts(nodes) // `dev kafka --nodes` takes consecutive ports
	if err != nil {
		return err
	}
	s.BrokerAddr = fmt.Sprintf("127.0.0.1:%d", brokerPort)
	s.Brokers = make([]string, nodes)
	for i := range s.Brokers {
		s.Brokers[i] = fmt.Sprintf("127.0.0.1:%d", brokerPort+i)
	}
	s.Broker = NewProc(ProcConfig{Name: "broker", Bin: s.cfg.Bin, LogDir: s.cfg.Dir,
		Args: []string{"dev", "kafka", "--listen", s.BrokerAddr, "--nodes", strconv.Itoa(nodes),
			"--data-dir", filepath.Join(s.cfg.Dir, "broker-data")},
		ReadyLine: "kafka-protocol broker listening on"})
	return s.Broker.Start(ctx)
}

// Procs lists every process, broker first.
func (s *System) Procs() []*Proc {
	var out []*Proc
	for _, p := range append([]*Proc{s.Broker, s.API}, append(append([]*Proc{}, s.Relays...), s.Consumers...)...) {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// Supervise restarts processes that exit on their own until ctx ends.
func (s *System) Supervise(ctx context.Context, logf func(string, ...any)) {
	for _, p := range s.Procs() {
		go p.Supervise(ctx, logf)
	}
}

// StopWorkers stops relays and consumers softly (SIGTERM), so that the
// final checks read databases nobody writes to.
func (s *System) StopWorkers() {
	for _, p := range append(append([]*Proc{}, s.Relays...), s.Consumers...) {
		p.Close()
	}
}

// Close stops every process and closes the pools.
func (s *System) Close() {
	procs := s.Procs()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Close()
	}
	if s.Ledger != nil {
		s.Ledger.Close()
	}
	if s.Consumer != nil {
		s.Consumer.Close()
	}
}

// Crashes sums the processes' unexpected exits.
func (s *System) Crashes() int {
	n := 0
	for _, p := range s.Procs() {
		n += p.Crashes()
	}
	return n
}

// Rejoins returns, over every run of the consumer processes, each time
// one re-joined its Kafka group because a partition stalled: when, which
// process and group, and the partitions it logged.
func (s *System) Rejoins() []string {
	var out []string
	for _, p := range s.Consumers {
		eachLogLine(p, func(_ int, _ time.Time, l logLine) {
			if l.Msg == kafkagroup.RejoinLogMessage {
				out = append(out, fmt.Sprintf("%s %s %s: %s", l.Time.UTC().Format("15:04:05"), p.Name, l.Group, l.Error))
			}
		})
	}
	sort.Strings(out)
	return out
}

// FirstApplied returns, for every restart of a consumer process (after a
// SIGKILL or an exit of its own), how long after it started it applied
// its first event (consumers.FirstAppliedLogMessage, the earliest of its
// consumers). A restart that applied nothing (no events came) is left out.
func (s *System) FirstApplied() []time.Duration {
	var out []time.Duration
	for _, p := range s.Consumers {
		first := map[int]time.Duration{}
		eachLogLine(p, func(run int, started time.Time, l logLine) {
			if _, seen := first[run]; run > 1 && !seen && l.Msg == consumers.FirstAppliedLogMessage {
				first[run] = l.Time.Sub(started)
			}
		})
		for _, d := range first {
			out = append(out, d)
		}
	}
	return out
}

// logLine is what the suite reads of a JSON log line of a process.
type logLine struct {
	Time  time.Time `json:"time"`
	Msg   string    `json:"msg"`
	Group string    `json:"consumer_group"`
	Error string    `json:"error"`
}

// eachLogLine calls fn with every JSON line of p's log, over all its runs,
// with the run's number (1 for the first start) and start time (Start's
// marker line).
func eachLogLine(p *Proc, fn func(run int, started time.Time, l logLine)) {
	data, err := os.ReadFile(p.LogPath())
	if err != nil {
		return
	}
	run, started := 0, time.Time{}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if m := startMarker.FindSubmatch(line); m != nil {
			run++
			started, _ = time.Parse(time.RFC3339Nano, string(m[1]))
			continue
		}
		var l logLine
		if json.Unmarshal(line, &l) == nil {
			fn(run, started, l)
		}
	}
}

// KillAndRestart SIGKILLs p, waits pause, and starts it again.
func (s *System) KillAndRestart(ctx context.Context, p *Proc, pause time.Duration) error {
	return restartAfter(ctx, p, pause, p.Kill)
}

// restartAfter stops p with stop, waits pause, and starts it again.
func restartAfter(ctx context.Context, p *Proc, pause time.Duration, stop func()) error {
	stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(pause):
	}
	return p.Start(ctx)
}

// FreezeRelay SIGSTOPs relay i for d (longer than its lease) and then
// SIGCONTs it. It returns how long it took until none of the relay's
// leases was live any more (another relay may take them over), or -1 if
// that did not happen while it was frozen.
func (s *System) FreezeRelay(ctx context.Context, i int, d time.Duration) (time.Duration, error) {
	p := s.Relays[i]
	owner := fmt.Sprintf("relay-%c", 'A'+i)
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return -1, err
	}
	defer func() { _ = p.Signal(syscall.SIGCONT) }()
	start := time.Now()
	takeover := time.Duration(-1)
	for time.Since(start) < d {
		if takeover < 0 {
			var live int
			if err := s.Ledger.QueryRow(ctx, `SELECT count(*) FROM relay_leases WHERE owner = $1 AND expires_at > now()`, owner).Scan(&live); err == nil && live == 0 {
				takeover = time.Since(start)
			}
		}
		select {
		case <-ctx.Done():
			return takeover, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return takeover, nil
}

// TerminateSessions runs pg_terminate_backend on the relays' sessions in
// the ledger database and the consumers' in the consumer database, and
// returns how many it ended.
func (s *System) TerminateSessions(ctx context.Context) (int, error) {
	var a, b int
	if err := s.Ledger.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, postgres.RelayApplicationName).Scan(&a); err != nil {
		return 0, fmt.Errorf("terminate relay sessions: %w", err)
	}
	if err := s.Consumer.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE $1`, consumerAppName+"-%").Scan(&b); err != nil {
		return a, fmt.Errorf("terminate consumer sessions: %w", err)
	}
	return a + b, nil
}

// MoveLeaders has the broker cluster elect new partition leaders (SIGUSR1
// to `posthorn dev kafka`): producers and consumers writing to or reading
// from a former leader must find the new one.
func (s *System) MoveLeaders() error {
	if s.cfg.Kafka != nil {
		return MoveKafkaLeaders(context.Background(), s.Brokers)
	}
	return s.Broker.Signal(syscall.SIGUSR1)
}

// BrokerOutage kills the broker (SIGKILL, or SIGTERM with
// BrokerStopsCleanly), keeps it down for d and restarts it on the same port
// and data directory. On a real Kafka cluster it SIGKILLs one node, the
// next in turn, and restarts it.
func (s *System) BrokerOutage(ctx context.Context, d time.Duration) error {
	if k := s.cfg.Kafka; k != nil {
		i := int(s.outages.Add(1)-1) % len(k.Nodes)
		if err := k.KillNode(i); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		// Restarted even when the run ends: the final reads need the node.
		return k.RestartNode(i)
	}
	if !s.cfg.BrokerStopsCleanly {
		return s.KillAndRestart(ctx, s.Broker, d)
	}
	return restartAfter(ctx, s.Broker, d, func() { s.Broker.Term(30 * time.Second) })
}

// FaultPosting posts a balanced transfer between accounts through the
// ledger's write path inside a transaction the fault hook holds open for
// hold and then commits, or rolls back when rollback is set. It returns
// the event IDs the transaction wrote: committed ones, or (rollback) the
// ones that must never reach a consumer.
func (s *System) FaultPosting(ctx context.Context, key string, accounts [2]string, hold time.Duration, rollback bool) ([]string, error) {
	md := map[string]string{"source": "posthorn-fault"}
	if hold > 0 {
		md["fault_hold_seconds"] = fmt.Sprintf("%.3f", hold.Seconds())
	}
	if rollback {
		md["fault_rollback"] = "true"
	}
	p := core.Posting{
		Entries: []core.Entry{
			{Account: accounts[0], Direction: core.Debit, Amount: 700, Currency: "EUR"},
			{Account: accounts[1], Direction: core.Credit, Amount: 700, Currency: "EUR"},
		},
		Metadata: md,
	}
	res, _, err := s.store.Post(ctx, key, p)
	if !rollback {
		if err != nil {
			return nil, err
		}
		ids := make([]string, len(res.Events))
		for i, e := range res.Events {
			ids[i] = e.EventID
		}
		return ids, nil
	}
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || !strings.HasPrefix(pgErr.Message, "posthorn-fault-rollback events=") {
		return nil, fmt.Errorf("rollback posting did not roll back as the hook does: %v", err)
	}
	ids := strings.Split(strings.TrimPrefix(pgErr.Message, "posthorn-fault-rollback events="), ",")
	if len(ids) != 2 {
		return nil, fmt.Errorf("rollback posting wrote %d outbox rows, want 2: %q", len(ids), pgErr.Message)
	}
	return ids, nil
}

// WithAppName returns dsn with PostgreSQL's application_name set to name,
// which tells a pool's backends apart in pg_stat_activity; dsn unchanged
// when it is not a URL.
func WithAppName(dsn, name string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) { return freePorts(1) }

// freePorts returns the first of n consecutive TCP ports on 127.0.0.1 that
// were all free a moment ago.
func freePorts(n int) (int, error) {
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		base := ln.Addr().(*net.TCPAddr).Port
		held := []net.Listener{ln}
		for i := 1; i < n; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				break
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
		if len(held) == n {
			return base, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive free ports on 127.0.0.1", n)
}

// Reconcile runs `posthorn reconcile --no-record` over the run's ledger
// and consumer databases and returns its output and whether it said clean
// (exit 0 and "result: clean"): the command an operator runs, held to what
// the suite's own checks found.
func (s *System) Reconcile(ctx context.Context) (string, bool, error) {
	cmd := exec.CommandContext(ctx, s.cfg.Bin, "reconcile", "--no-record")
	cmd.Env = append(os.Environ(), "POSTHORN_DATABASE__URL="+s.cfg.LedgerURL, "POSTHORN_CONSUMER__DATABASE__URL="+s.cfg.ConsumerURL,
		"POSTHORN_LOG__LEVEL=warn")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return string(out), false, fmt.Errorf("posthorn reconcile: %w", err)
	}
	return string(out), err == nil && strings.Contains(string(out), "result: clean"), nil
}
