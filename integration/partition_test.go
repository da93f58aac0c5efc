package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/demo"
	"github.com/posthorn/posthorn/internal/dev/pgcluster"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/kafkacluster"
	"github.com/posthorn/posthorn/internal/testkit/netfault"
	"github.com/posthorn/posthorn/internal/testkit/pgtest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// The partition suite: the network splits, stalls and drops while
// postings go on, on a real three-node Apache Kafka cluster (replication
// 3, min ISR 2), with the relays and consumers as processes under Unix
// users of their own so that netfault can cut their links. Each scenario
// runs in polling and CDC mode and in exactly-once mode, and has a negative
// control that switches a protection off and must be caught by the same
// checks. make test runs partitionSubset; make test-partitions and make
// soak (POSTHORN_PARTITIONS=all) run everything. docs/fault-suite.md has
// the matrix.

// partitionMode is how the relays run.
type partitionMode struct {
	name     string
	cdc, eos bool
}

var (
	modePolling = partitionMode{name: "polling"}
	modeCDC     = partitionMode{name: "cdc", cdc: true}
	modeEOS     = partitionMode{name: "exactly-once", eos: true}
	allModes    = []partitionMode{modePolling, modeCDC, modeEOS}
)

// partitionSize is a run's load and timing: the fault begins at At and
// lasts For (a scenario may say otherwise), the load goes on Tail after.
type partitionSize struct {
	Rate         float64
	At, For      time.Duration
	Tail         time.Duration
	DrainTimeout time.Duration
}

var (
	fullSize   = partitionSize{Rate: 100, At: 15 * time.Second, For: 30 * time.Second, Tail: 15 * time.Second, DrainTimeout: 4 * time.Minute}
	subsetSize = partitionSize{Rate: 100, At: 8 * time.Second, For: 12 * time.Second, Tail: 6 * time.Second, DrainTimeout: 3 * time.Minute}
)

// partitionEnv is what a scenario's fault acts on.
type partitionEnv struct {
	net       *netfault.Net
	k         *kafkacluster.Cluster
	nodeUsers []netfault.User
	users     map[string]netfault.User
	sys       *faultkit.System
	mode      partitionMode
	// ledgerPort and consumerPort are the PostgreSQL servers' ports of
	// the ledger and the consumers' databases.
	ledgerPort, consumerPort int
}

// clientPorts are the brokers' client listeners; allPorts these and the
// controller listeners.
func (e *partitionEnv) clientPorts() []int {
	var out []int
	for _, n := range e.k.Nodes {
		out = append(out, n.Port)
	}
	return out
}

func (e *partitionEnv) nodePorts(i int) []int {
	return []int{e.k.Nodes[i].Port, e.k.Nodes[i].ControllerPort}
}

func (e *partitionEnv) allPorts() []int {
	var out []int
	for i := range e.k.Nodes {
		out = append(out, e.nodePorts(i)...)
	}
	return out
}

// activeRelay is the relay a relay-side fault hits: relay-A, or in CDC
// mode the one holding the slot's lease.
func (e *partitionEnv) activeRelay(ctx context.Context) (string, error) {
	if !e.mode.cdc {
		return "relay-A", nil
	}
	var owner string
	err := e.sys.Ledger.QueryRow(ctx, `SELECT owner FROM relay_cdc_leases WHERE owner IS NOT NULL AND expires_at > now() ORDER BY expires_at DESC LIMIT 1`).Scan(&owner)
	if err != nil {
		return "", fmt.Errorf("the CDC slot's lease holder: %w", err)
	}
	return owner, nil
}

// killActiveRelay SIGKILLs the active relay after d and restarts it at
// once (a control's crash during the fault).
func (e *partitionEnv) killActiveRelay(ctx context.Context, d time.Duration) error {
	name, err := e.activeRelay(ctx)
	if err != nil {
		return err
	}
	for _, p := range e.sys.Relays {
		if p.Name == name {
			return e.killAfter(ctx, p, d)
		}
	}
	return fmt.Errorf("no relay process %s", name)
}

// killAfter SIGKILLs p after d and restarts it at once.
func (e *partitionEnv) killAfter(ctx context.Context, p *faultkit.Proc, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
	}
	return e.sys.KillAndRestart(ctx, p, 0)
}

// kafkaAdmin is a short-lived admin client of the cluster.
func (e *partitionEnv) kafkaAdmin() (*kgo.Client, *kadm.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.k.Brokers...))
	if err != nil {
		return nil, nil, err
	}
	return cl, kadm.NewClient(cl), nil
}

// groupCoordinator is the node coordinating the consumer group's offsets
// (the leader of its __consumer_offsets partition).
func (e *partitionEnv) groupCoordinator(ctx context.Context, group string) (int, error) {
	cl, adm, err := e.kafkaAdmin()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	r, ok := adm.FindGroupCoordinators(ctx, group)[group]
	if !ok {
		return 0, fmt.Errorf("the coordinator of group %s: no answer", group)
	}
	if r.Err != nil {
		return 0, fmt.Errorf("the coordinator of group %s: %w", group, r.Err)
	}
	return int(r.NodeID), nil
}

// quorumLeader is the active controller: the leader of the KRaft metadata
// quorum.
func (e *partitionEnv) quorumLeader(ctx context.Context) (int, error) {
	cl, _, err := e.kafkaAdmin()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeQuorumRequest()
	topic := kmsg.NewDescribeQuorumRequestTopic()
	topic.Topic = "__cluster_metadata"
	part := kmsg.NewDescribeQuorumRequestTopicPartition()
	topic.Partitions = append(topic.Partitions, part)
	req.Topics = append(req.Topics, topic)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("describe quorum: %w", err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			return int(p.LeaderID), nil
		}
	}
	return 0, errors.New("describe quorum: no partition in the answer")
}

// isolate cuts node i's links to and from the other nodes on ports (of
// each node: its client/inter-broker and controller listeners, or only the
// controller's), both ways; clients still reach every node.
func (e *partitionEnv) isolate(i int, controllerOnly bool) (*netfault.Fault, error) {
	ports := func(j int) []int {
		if controllerOnly {
			return []int{e.k.Nodes[j].ControllerPort}
		}
		return e.nodePorts(j)
	}
	var links []netfault.Link
	for j := range e.k.Nodes {
		if j == i {
			continue
		}
		links = append(links, netfault.Link{From: e.nodeUsers[i], To: ports(j)}, netfault.Link{From: e.nodeUsers[j], To: ports(i)})
	}
	return e.net.Cut(netfault.Both, links...)
}

// partitionScenario is one fault. inject makes it (after For the run
// heals it); its control is a protection switched off that the same checks
// must catch.
type partitionScenario struct {
	name    string
	doc     string
	forFull time.Duration // For in the full suite, if not fullSize's
	// backlog postings are written while the relays are stopped, before
	// the load; the relays then start on them and the fault is set
	// backlogAt into the load, as they drain.
	backlog   int
	backlogAt time.Duration
	inject    func(ctx context.Context, e *partitionEnv) (heal func() error, err error)
	control   partitionControl
}

// partitionControl is a scenario's negative control: a run in mode with
// the system changed by sys, which must bite.
type partitionControl struct {
	mode  partitionMode
	what  string
	sys   func(*faultkit.SystemConfig)
	bites func(r partitionResult) (bool, string)
	// killRelay SIGKILLs the active relay 5 s into the fault (restarted at
	// once): the protection it switches off only matters when the relay
	// dies with records unsent, since a living relay's producer keeps
	// retrying them and delivers them after the heal.
	killRelay bool
	// killConsumer SIGKILLs consumer-2 10 s into the fault (restarted at
	// once), so its group moves its partitions while the fault lasts.
	killConsumer bool
}

// healing is a fault's heal, or the error that kept it from being made.
func healing(f *netfault.Fault, err error) (func() error, error) {
	if err != nil {
		return nil, err
	}
	return f.Heal, nil
}

// cutActiveRelay is an inject that cuts the active relay's links to the
// ports to(e) in direction d.
func cutActiveRelay(d netfault.Dir, to func(e *partitionEnv) []int) func(context.Context, *partitionEnv) (func() error, error) {
	return func(ctx context.Context, e *partitionEnv) (func() error, error) {
		name, err := e.activeRelay(ctx)
		if err != nil {
			return nil, err
		}
		return healing(e.net.Cut(d, netfault.Link{From: e.users[name], To: to(e)}))
	}
}

// cutActiveRelayReplies drops every broker's responses to the active
// relay. In exactly-once mode the cut begins as the relay asks to commit a
// transaction: the coordinator commits and the relay cannot learn it, the
// outcome the committed positions exist for. Started at a random moment
// it mostly caught a transaction before its commit, which is only aborted.
func cutActiveRelayReplies(ctx context.Context, e *partitionEnv) (func() error, error) {
	name, err := e.activeRelay(ctx)
	if err != nil {
		return nil, err
	}
	link := netfault.Link{From: e.users[name], To: e.clientPorts()}
	if e.mode.eos {
		return healing(e.net.CutAllRepliesFrom(netfault.KafkaRequest(int16(kmsg.EndTxn)), link))
	}
	return healing(e.net.Cut(netfault.Replies, link))
}

func (e *partitionEnv) ledgerPorts() []int { return []int{e.ledgerPort} }

// withoutInbox is the control of the scenarios that could apply an event
// twice: consumers without the inbox.
var withoutInbox = partitionControl{mode: modePolling, what: "consumers without the inbox (--unsafe-no-inbox)",
	sys:   func(c *faultkit.SystemConfig) { c.UnsafeNoInbox = true },
	bites: bitesDoubled}

var partitionScenarios = []partitionScenario{
	{
		name:   "relay cut from every broker",
		doc:    "the active relay's connections to all three brokers dropped both ways, then healed",
		inject: cutActiveRelay(netfault.Both, (*partitionEnv).clientPorts),
		control: partitionControl{mode: modePolling, what: "relays mark before the ACK (--unsafe-mark-before-ack), the cut relay SIGKILLed during the cut",
			sys:   func(c *faultkit.SystemConfig) { c.UnsafeMarkBeforeAck = true },
			bites: bitesLost, killRelay: true},
	},
	{
		name:   "ACKs lost",
		doc:    "requests of the active relay reach every broker, every response is dropped (one way); in exactly-once mode from its next commit (EndTxn) on",
		inject: cutActiveRelayReplies,
		control: partitionControl{mode: modeEOS, what: "exactly-once relays that fence but skip the committed positions (--unsafe-skip-positions)",
			sys:   func(c *faultkit.SystemConfig) { c.RelayArgs = append(c.RelayArgs, "--unsafe-skip-positions") },
			bites: bitesCommittedRepeats},
	},
	{
		// A transaction open when the answers stop holds back every
		// read_committed reader of its partitions; in a drain the relays'
		// transactions are full batches, one after another.
		name:      "ACKs lost during a drain",
		doc:       "as ACKs lost, as the relays start on a backlog of 30,000 postings written while they were stopped (in exactly-once mode from their first commit on), through the drain",
		backlog:   30000,
		backlogAt: 2 * time.Second,
		inject:    cutActiveRelayReplies,
		control: partitionControl{mode: modeEOS, what: "exactly-once relays that fence but skip the committed positions (--unsafe-skip-positions)",
			sys:   func(c *faultkit.SystemConfig) { c.RelayArgs = append(c.RelayArgs, "--unsafe-skip-positions") },
			bites: bitesCommittedRepeats},
	},
	{
		name:   "relay cut from the ledger (zombie)",
		doc:    "the active relay loses the ledger database but still reaches the brokers: its lease runs out, the other relay takes over",
		inject: cutActiveRelay(netfault.Both, (*partitionEnv).ledgerPorts),
		control: partitionControl{mode: modeEOS, what: "exactly-once relays without fencing each other (a transactional ID prefix per relay)",
			sys: func(c *faultkit.SystemConfig) {
				c.RelayEnvEach = map[string][]string{
					"relay-A": {"POSTHORN_SINK__KAFKA__TRANSACTIONAL_ID_PREFIX=unfenced-a"},
					"relay-B": {"POSTHORN_SINK__KAFKA__TRANSACTIONAL_ID_PREFIX=unfenced-b"},
				}
			},
			bites: bitesCommittedRepeats},
	},
	{
		// The node chosen coordinates a consumer group as well as leading
		// event partitions (each of the three leads one or two of the
		// four): the consumers' offsets then commit nowhere while it is
		// cut off, and what they applied meanwhile comes to them again if
		// their group moves before the commits land.
		name: "leader on the minority side",
		doc:  "the node coordinating the balance-projection group, a leader of event partitions too, cut from the other two (replication and controller links), clients still reach it",
		inject: func(ctx context.Context, e *partitionEnv) (func() error, error) {
			i, err := e.groupCoordinator(ctx, projection.Name)
			if err != nil {
				return nil, err
			}
			return healing(e.isolate(i, false))
		},
		// Without the inbox a consumer applies an event twice here only
		// if its group hands a partition on before the offsets of what it
		// applied commit; whether the group moves during the cut is up to
		// its members, and in full runs it mostly held. The control kills
		// consumer-2 10 s into the cut, so its partitions move while the
		// commits go to a coordinator that cannot replicate them.
		control: partitionControl{mode: modePolling, what: "consumers without the inbox (--unsafe-no-inbox), consumer-2 SIGKILLed 10 s into the cut",
			sys: withoutInbox.sys, bites: bitesDoubled, killConsumer: true},
	},
	{
		name: "controller quorum split",
		doc:  "the active controller cut from the other two voters on the controller listeners only",
		inject: func(ctx context.Context, e *partitionEnv) (func() error, error) {
			i, err := e.quorumLeader(ctx)
			if err != nil {
				return nil, err
			}
			return healing(e.isolate(i, true))
		},
		// The produces the split fails are failed for good by the client
		// (a living relay sends them again), so a relay that marked them
		// first loses them.
		control: partitionControl{mode: modePolling, what: "relays mark before the ACK (--unsafe-mark-before-ack)",
			sys:   func(c *faultkit.SystemConfig) { c.UnsafeMarkBeforeAck = true },
			bites: bitesLost},
	},
	{
		name: "consumer cut during a rebalance",
		doc:  "consumer-1 cut from every broker while consumer-2 is SIGKILLed and restarted (its group rebalances)",
		inject: func(ctx context.Context, e *partitionEnv) (func() error, error) {
			f, err := e.net.Cut(netfault.Both, netfault.Link{From: e.users["consumer-1"], To: e.clientPorts()})
			if err != nil {
				return nil, err
			}
			if err := e.sys.KillAndRestart(ctx, e.sys.Consumers[1], 500*time.Millisecond); err != nil {
				_ = f.Heal()
				return nil, err
			}
			return f.Heal, nil
		},
		control: withoutInbox,
	},
	{
		name: "consumer loses its database's replies",
		doc:  "consumer-1's connections to its database lose every answer from their first COMMIT on: the effect committed, the consumer cannot know",
		// The answer to a COMMIT, not just any answer: a transaction
		// whose statement loses its answer never commits, so without the
		// inbox only a lost COMMIT answer applies an effect twice.
		inject: func(ctx context.Context, e *partitionEnv) (func() error, error) {
			return healing(e.net.CutRepliesFrom(netfault.Needle("commit"), netfault.Link{From: e.users["consumer-1"], To: []int{e.consumerPort}}))
		},
		control: withoutInbox,
	},
	{
		name:    "slow lossy network",
		doc:     "every broker link (clients, replication, controllers) delayed 100-300 ms with jitter and 1% of packets dropped",
		forFull: time.Minute,
		inject: func(ctx context.Context, e *partitionEnv) (func() error, error) {
			return healing(e.net.Degrade(netfault.Impairment{Delay: 100 * time.Millisecond, Jitter: 200 * time.Millisecond, Loss: 0.01},
				netfault.Link{To: e.allPorts()}))
		},
		// Nothing here makes a record repeat on its own (the idempotent
		// producer absorbs its retries), so consumers without the inbox
		// stayed whole. What the slow links do is keep every batch sent
		// and unacknowledged for round trips of up to 600 ms and more: a
		// relay that dies then leaves them unmarked, its successor sends
		// them again, and only the inbox keeps them from applying twice.
		// (A relay that marks before the ACK loses nothing here: the
		// requests it sent reach the brokers after it died.)
		control: partitionControl{mode: modePolling, what: "consumers without the inbox (--unsafe-no-inbox), the active relay SIGKILLed 5 s into the slow minute",
			sys:   withoutInbox.sys,
			bites: bitesDoubled, killRelay: true},
	},
}

// partitionResult is what one run found.
type partitionResult struct {
	scenario string
	mode     partitionMode
	fig      faultkit.Figures
	kgo      faultkit.Wire
	java     faultkit.JavaWire
	vis      faultkit.Visibility
	clean    bool // posthorn reconcile
	// The summary's counts: committed events missing on the topic (the
	// larger of the two readers'), effects applied more than once or
	// balances off, records of aborted transactions a read_committed
	// reader received, first receipts out of revision order.
	lost, doubled, abortedReads, disorder int
	// committedRepeats are records a read_committed reader received more
	// than once (zero in exactly-once mode).
	committedRepeats int
	elapsed          time.Duration
	// late is the invariants checked again once the readers and
	// reconcile are done, in a control without the inbox (bitesDoubled);
	// reconcile is what posthorn reconcile printed.
	late      demo.Report
	reconcile string
}

func bitesLost(r partitionResult) (bool, string) {
	return r.lost > 0, fmt.Sprintf("%d committed events missing on the topic", r.lost)
}

// bitesDoubled: without the inbox a consumer has no dispositions, so only
// the balances tell; the run settles once every event reached the
// consumers at least once (SettleAllSeen), so a balance that differs was
// changed twice by one event. They are checked at the settle and again at
// the run's end: a group whose coordinator was cut off may rebalance and
// hand its consumers what they applied long after they went quiet, and
// such a repeat is as doubled as an early one. Two members applying one
// partition's events during a rebalance can also apply an account's
// events out of revision order: the sum comes out right, the revision
// stored beside it does not, and reconcile's balance view check, which
// sums the journal up to that revision, finds it.
func bitesDoubled(r partitionResult) (bool, string) {
	balances := func(rep demo.Report) []string {
		var bad []string
		for _, v := range rep.Violations {
			if v.Check == demo.CheckBalances {
				bad = append(bad, v.Detail)
			}
		}
		return bad
	}
	settled, late := balances(r.fig.Report), balances(r.late)
	view := balanceViewFinding.FindString(r.reconcile)
	return len(settled)+len(late) > 0 || view != "", fmt.Sprintf("balances differ from the ledger's: at the settle %v; at the run's end %v; reconcile: %q", settled, late, view)
}

// balanceViewFinding is posthorn reconcile's line for a balance view whose
// rows differ from the journal.
var balanceViewFinding = regexp.MustCompile(`balance view \S+ differs from the journal: \d+ rows of \d+ compared`)

func bitesCommittedRepeats(r partitionResult) (bool, string) {
	return r.committedRepeats > 0, fmt.Sprintf("%d repeats seen by read_committed readers", r.committedRepeats)
}

// partitionRuns collects the runs of one test process for the summary.
var partitionRuns struct {
	sync.Mutex
	results []partitionResult
}

// runPartition runs sc in mode at size on a fresh cluster; sysMod, when
// set, switches a protection off (a control), and then the run is
// not required to be clean.
func runPartition(t *testing.T, sc partitionScenario, mode partitionMode, size partitionSize, ctl *partitionControl) partitionResult {
	t.Helper()
	began := time.Now()
	control := ctl != nil
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	nf := netfault.New(t)
	claim := func() netfault.User {
		u, err := nf.User()
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	e := &partitionEnv{net: nf, mode: mode, users: map[string]netfault.User{}}
	for range 3 {
		e.nodeUsers = append(e.nodeUsers, claim())
	}
	for _, name := range []string{"relay-A", "relay-B", "consumer-1", "consumer-2"} {
		e.users[name] = claim()
	}
	names := make([]string, len(e.nodeUsers))
	for i, u := range e.nodeUsers {
		names[i] = u.Name
	}
	e.k = kafkacluster.StartWith(t, kafkacluster.Options{Nodes: 3, Users: names})
	e.k.RequireOwn(t)

	cfg := faultkit.SystemConfig{Bin: posthornBin(t), Dir: t.TempDir(), Kafka: e.k, LeaseTTL: apacheLeaseTTL,
		ExactlyOnce: mode.eos, Users: e.users}
	keepLogsOnFailure(t, cfg.Dir)
	if err := faultkit.ExposeDir(filepath.Dir(cfg.Bin)); err != nil {
		t.Fatal(err)
	}
	if mode.cdc {
		cfg.RelayMode = "cdc"
		_, cfg.LedgerURL, _ = pgtest.LogicalLedger(t, pgcluster.Options{}, 4)
	} else {
		cfg.LedgerURL, _ = pgtest.Ledger(t)
	}
	cfg.ConsumerURL, _ = pgtest.Consumer(t)
	e.ledgerPort, e.consumerPort = urlPort(t, cfg.LedgerURL), urlPort(t, cfg.ConsumerURL)
	if control {
		ctl.sys(&cfg)
	}
	s, err := faultkit.StartSystem(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	e.sys = s
	watch, err := faultkit.WatchVisibility(s.Brokers)
	if err != nil {
		t.Fatal(err)
	}

	faultFor := size.For
	if sc.forFull > 0 && size.For == fullSize.For {
		faultFor = sc.forFull
	}
	faultAt := size.At
	if sc.backlog > 0 {
		if err := e.writeBacklog(ctx, t, sc.backlog); err != nil {
			t.Fatal(err)
		}
		faultAt = sc.backlogAt
	}
	loadFor := faultAt + faultFor + size.Tail
	rc := faultkit.RunConfig{
		Postings: int(size.Rate * loadFor.Seconds()), Rate: size.Rate, Workers: 8,
		Scripted: []faultkit.ScriptedFault{{Name: sc.name, At: faultAt, For: faultFor,
			Inject: func(ctx context.Context) (func() error, error) {
				if sc.backlog > 0 {
					if p, err := demo.ReadProgress(ctx, s.Ledger, s.Consumer, faultkit.Consumers); err == nil {
						t.Logf("%d events unrelayed as the fault is set", p.Unrelayed)
					}
				}
				heal, err := sc.inject(ctx, e)
				if err == nil && control && ctl.killRelay {
					err = e.killActiveRelay(ctx, 5*time.Second)
				}
				if err == nil && control && ctl.killConsumer {
					err = e.killAfter(ctx, e.sys.Consumers[1], 10*time.Second)
				}
				return heal, err
			}}},
		Settle: faultkit.SettleDelivered, DrainTimeout: size.DrainTimeout, Logf: t.Logf,
	}
	if control {
		// A control may lose events or double effects: wait for quiet,
		// not for every event applied once; without the inbox, until every
		// event reached the consumers at least once (bitesDoubled).
		rc.Settle = faultkit.SettleQuiet
		if cfg.UnsafeNoInbox {
			rc.Settle = faultkit.SettleAllSeen
		}
	}
	fig, err := faultkit.Run(ctx, s, rc)
	t.Logf("%s, %s:\n%s", sc.name, mode.name, fig)
	if err != nil {
		dumpLogs(t, s)
		t.Fatal(err)
	}
	r := partitionResult{scenario: sc.name, mode: mode, fig: fig}
	var lastHeal time.Time
	for _, h := range fig.Heals {
		lastHeal = h.Healed
	}
	// The open transaction a fault left is aborted by a fence or by the
	// transaction timeout; the watch waits past that.
	if r.vis, err = watch.Stop(ctx, lastHeal, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("live readers: %s", r.vis)
	if r.kgo, err = s.WireKgo(ctx); err != nil {
		t.Fatal(err)
	}
	t.Log(r.kgo)
	if r.java, err = s.WireJava(ctx, ""); err != nil {
		t.Fatal(err)
	}
	t.Log(r.java)
	out, clean, err := s.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.clean, r.reconcile = clean, out
	if !clean {
		t.Logf("posthorn reconcile:\n%s", out)
	}
	if control && cfg.UnsafeNoInbox {
		if r.late, err = demo.Verify(ctx, s.Ledger, s.Consumer, demo.VerifyOptions{RolledBack: fig.RolledBack}); err != nil {
			t.Fatal(err)
		}
	}
	r.lost = max(len(r.kgo.Missing), r.java["missing"])
	for _, v := range fig.Report.Violations {
		if v.Check == demo.CheckApplied || v.Check == demo.CheckBalances {
			r.doubled++
		}
	}
	r.abortedReads = r.vis.AbortedReads
	r.disorder = max(len(r.kgo.Disorder), r.java["out_of_order"])
	r.committedRepeats = max(r.kgo.Repeats, r.java["repeats"])
	r.elapsed = time.Since(began)
	relayMoves, consumersMove, relayBack, caughtUp := fig.AfterHeal(sc.name)
	t.Logf("FIGURES %s | %s | relay moves %v, consumers move %v after the heal; relay backlog back %v, consumers caught up %v | repeats absorbed by the inbox %v, read_committed repeats %d | aborted transactions %d (%d records) | invisible to read_committed at most %v, %v after the heal | reconcile clean %v | %v",
		sc.name, mode.name, round(relayMoves), round(consumersMove), round(relayBack), round(caughtUp), fig.Duplicates, r.committedRepeats,
		r.vis.AbortedTxns, r.vis.Aborted, round(r.vis.MaxInvisible), round(r.vis.AfterHeal), r.clean, round(r.elapsed))
	if control {
		return r
	}
	partitionRuns.Lock()
	partitionRuns.results = append(partitionRuns.results, r)
	partitionRuns.Unlock()
	if !fig.Report.Clean() {
		dumpLogs(t, s)
		t.Errorf("invariants broken:\n%s", fig)
	}
	for what, n := range map[string]int{"committed events missing": r.lost, "doubled effects": r.doubled, "aborted reads": r.abortedReads,
		"out of order": r.disorder, "unknown records (kgo)": len(r.kgo.Unknown), "unknown records (java)": r.java["unknown"],
		"committed records the read_committed reader missed": r.vis.MissedCommitted, "records of transactions never ended": r.vis.Open} {
		if n != 0 {
			t.Errorf("%s: %d", what, n)
		}
	}
	if mode.eos && r.committedRepeats != 0 {
		t.Errorf("exactly-once: read_committed readers received %d repeats", r.committedRepeats)
	}
	if !r.clean {
		t.Errorf("posthorn reconcile is not clean:\n%s", out)
	}
	if mode.eos && r.vis.AfterHeal > invisibleBound {
		t.Errorf("a committed event stayed invisible to read_committed readers %v after the heal; the bound is %v", r.vis.AfterHeal, invisibleBound)
	}
	return r
}

// writeBacklog stops the relays, posts n transfers as fast as the API
// takes them and starts the relays again: they start on a backlog, as
// after an outage or a slow day. It returns once a relay is active (in
// CDC mode, holds the slot's lease), so the fault finds one to hit.
func (e *partitionEnv) writeBacklog(ctx context.Context, t *testing.T, n int) error {
	for _, p := range e.sys.Relays {
		p.Term(10 * time.Second)
	}
	began := time.Now()
	res, err := demo.Load(ctx, demo.LoadConfig{BaseURL: e.sys.APIURL, Postings: n, Workers: 8, AccountPrefix: "acc-", KeyPrefix: "backlog-"})
	if err != nil {
		return fmt.Errorf("the backlog: %w", err)
	}
	t.Logf("backlog: %d postings (%d events) in %v, the relays stopped", res.Postings, res.Events, round(time.Since(began)))
	for _, p := range e.sys.Relays {
		if err := p.Start(ctx); err != nil {
			return err
		}
	}
	wait.ForStatus(t, 30*time.Second, "an active relay", func() (bool, string) {
		if _, err := e.activeRelay(ctx); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return nil
}

// invisibleBound is the longest a committed event may stay invisible to
// read_committed readers after a fault heals, in exactly-once mode: the
// relay aborts what it left open as soon as it reaches the brokers again
// (docs/sinks.md).
const invisibleBound = 20 * time.Second

func round(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }

// keepLogsOnFailure copies the processes' logs of a run that failed out of
// its temporary directory (removed when the test ends) to
// $TMPDIR/posthorn-partitions-failed/<test>, for the evidence.
func keepLogsOnFailure(t *testing.T, dir string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		dst := filepath.Join(os.TempDir(), "posthorn-partitions-failed", strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Log(err)
			return
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		for _, l := range logs {
			if data, err := os.ReadFile(l); err == nil {
				_ = os.WriteFile(filepath.Join(dst, filepath.Base(l)), data, 0o644)
			}
		}
		t.Logf("the processes' logs are kept in %s", dst)
	})
}

func urlPort(t *testing.T, dsn string) int {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		return 5432
	}
	return p
}

// partitionSubset is what make test runs at the short size, with its
// control: about 4 minutes on a 2-core machine. ACKs lost in exactly-once
// mode is the fault where a relay least knows what it did: stored records
// unacknowledged, commits whose outcome is unknown, transactions to abort.
var partitionSubset = []struct {
	scenario string
	mode     partitionMode
}{
	{"ACKs lost", modeEOS},
}

// partitionsAll reports whether the whole suite runs (make
// test-partitions, make soak).
func partitionsAll() bool { return os.Getenv("POSTHORN_PARTITIONS") == "all" }

func scenarioNamed(t *testing.T, name string) partitionScenario {
	t.Helper()
	for _, sc := range partitionScenarios {
		if sc.name == name {
			return sc
		}
	}
	t.Fatalf("no partition scenario %q", name)
	return partitionScenario{}
}

// TestPartitions runs the scenarios (make test: partitionSubset; with
// POSTHORN_PARTITIONS=all every scenario in every mode at full size) and
// ends with the summary line.
func TestPartitions(t *testing.T) {
	skipInShortMode(t)
	type run struct {
		sc   partitionScenario
		mode partitionMode
	}
	var runs []run
	size := subsetSize
	if partitionsAll() {
		size = fullSize
		for _, sc := range partitionScenarios {
			for _, m := range allModes {
				runs = append(runs, run{sc, m})
			}
		}
	} else {
		for _, s := range partitionSubset {
			runs = append(runs, run{scenarioNamed(t, s.scenario), s.mode})
		}
	}
	began := time.Now()
	for _, r := range runs {
		t.Run(r.sc.name+"/"+r.mode.name, func(t *testing.T) { runPartition(t, r.sc, r.mode, size, nil) })
	}
	partitionRuns.Lock()
	defer partitionRuns.Unlock()
	scenarios := map[string]bool{}
	var lost, doubled, aborted, disorder int
	for _, r := range partitionRuns.results {
		scenarios[r.scenario] = true
		lost += r.lost
		doubled += r.doubled
		aborted += r.abortedReads
		disorder += r.disorder
	}
	t.Logf("partition suite: %d runs in %v", len(partitionRuns.results), round(time.Since(began)))
	// The summary make test-partitions prints last, without the prefix.
	fmt.Printf("PARTITIONS-SUMMARY partitions: %d scenarios, %d runs, lost %d, doubled effects %d, aborted reads %d, out of order %d\n",
		len(scenarios), len(partitionRuns.results), lost, doubled, aborted, disorder)
}

// TestPartitionControls runs each scenario's negative control (make
// test-partitions and make soak; make test runs the subset's first
// scenario's): the same fault with a protection off must be caught. A
// control that does not bite is run again, up to 2 runs.
func TestPartitionControls(t *testing.T) {
	skipInShortMode(t)
	scs := partitionScenarios
	size := fullSize
	if !partitionsAll() {
		scs, size = []partitionScenario{scenarioNamed(t, partitionSubset[0].scenario)}, subsetSize
	}
	var bit []string
	for _, sc := range scs {
		t.Run(sc.name, func(t *testing.T) {
			for attempt := 1; attempt <= 2; attempt++ {
				var ok bool
				var why string
				t.Run(fmt.Sprintf("%s/attempt-%d", sc.control.mode.name, attempt), func(t *testing.T) {
					r := runPartition(t, sc, sc.control.mode, size, &sc.control)
					ok, why = sc.control.bites(r)
				})
				t.Logf("control of %q (%s, %s), attempt %d: bites %v: %s", sc.name, sc.control.mode.name, sc.control.what, attempt, ok, why)
				if ok {
					bit = append(bit, sc.name)
					return
				}
				if t.Failed() {
					return
				}
			}
			t.Errorf("the control of %q (%s) did not bite in 2 runs: the checks would not catch this breach", sc.name, sc.control.what)
		})
	}
	t.Logf("partition controls: %d of %d bit: %s", len(bit), len(scs), strings.Join(slices.Sorted(slices.Values(bit)), "; "))
}
