// Package netfault partitions, slows and lossy-fies the network links of a
// test's own processes on this machine, and heals them: the fault suite's
// partitions (integration/partition_test.go).
//
// A link is the set of TCP connections that the processes of one Unix user
// (User, claimed for the test from a pool scripts/setup-machine creates)
// open to a set of ports on 127.0.0.0/8, such as a relay's connections to
// every Kafka broker or a consumer's to PostgreSQL. A fault marks those
// connections in conntrack from the OUTPUT hook (iptables' owner match on
// the sending socket's user, the destination ports, the original direction)
// and acts on the marked connections' packets as they arrive on lo (INPUT):
// it drops both directions (Cut Both), only the client's requests (Cut
// Requests) or only the server's replies (Cut Replies: requests arrive, every
// response and ACK is lost), or the replies of each connection from its
// first request matching a Trigger on (CutRepliesFrom: the trigger's match
// re-marks that connection as tripped in OUTPUT), or the replies of every
// connection of the links from the first such request on any of them
// (CutAllRepliesFrom: the match sets an entry of iptables' recent list that
// the drop checks), or queues them to this process (NFQUEUE), which holds
// each packet for a delay with jitter, in order per flow, and drops a share
// of them (Degrade). A Trigger is a string anywhere in a packet (Needle,
// iptables' string match) or bytes at an offset of the TCP payload
// (PayloadAt, KafkaRequest: iptables' u32 match).
//
// Invariants:
//
//   - Only loopback traffic is touched: the chains are reached from OUTPUT
//     with -o lo -d 127.0.0.0/8 and from INPUT with -i lo. No rule names an
//     address outside 127.0.0.0/8, and no packet of another interface or
//     namespace passes through them.
//   - Every rule lives in two chains of this process, PHNF-<pid>-o and
//     PHNF-<pid>-i, jumped to from OUTPUT and INPUT. Heal deletes a fault's
//     rules; Close (t.Cleanup) deletes the chains and their jumps, unbinds
//     the queue and frees the users.
//   - A run holds an exclusive flock on /run/posthorn-netfault/<pid>.lock
//     while its chains exist; the kernel drops it when the process dies, even
//     by SIGKILL. Open first sweeps every PHNF-<pid> chain whose lock is free
//     (its run is dead), so a killed test's rules last only until the next
//     run starts (Sweep does it alone).
//   - A pool user is this run's while it holds the user's flock and was
//     claimed only when no process ran under it, so a fault on a user hits
//     only this run's processes.
//   - Marks carry the run's pid and the fault's number (15 bits; the top bit
//     of that half is CutRepliesFrom's tripped flag), never reused within a
//     run of fewer than 32,768 faults: a connection marked by a healed fault is matched by no rule. A
//     connection carries the mark of the newest fault that selected it, so
//     two faults on the same connections at once are not supported.
//   - A queued packet whose run died is accepted, not dropped (--queue-bypass
//     with no listener; fail-open when the queue is full): a delay degrades
//     to no delay, never to a cut.
//
// It needs root, iptables (the nf_tables backend with its xtables matches:
// owner, multiport, conntrack, connmark, string, u32, recent, NFQUEUE) and
// the pool users; scripts/setup-machine installs both.
package netfault
