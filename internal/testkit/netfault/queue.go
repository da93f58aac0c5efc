package netfault

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// The nfnetlink_queue protocol (linux/netfilter/nfnetlink_queue.h): the
// kernel hands each packet an NFQUEUE rule queued to the process bound to
// its queue number, and holds it until the process sends a verdict. The
// verdicts may come in any order.
const (
	nfqnlMsgPacket  = 0
	nfqnlMsgVerdict = 1
	nfqnlMsgConfig  = 2

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2
	nfqaPayload    = 10

	nfqaCfgCmd      = 1
	nfqaCfgParams   = 2
	nfqaCfgQueueMax = 3
	nfqaCfgMask     = 4
	nfqaCfgFlags    = 5

	nfqnlCfgCmdBind  = 1
	nfqnlCopyPacket  = 2
	nfqaCfgFFailOpen = 1

	nfDrop   = 0
	nfAccept = 1

	// headerBytes of each packet are copied to this process: the IPv4
	// header and the TCP ports, the flow's key.
	headerBytes = 64
	queueMaxLen = 1 << 16
)

// queue holds the packets of one Degrade fault for their delay and drops
// its share of them.
type queue struct {
	num  uint16
	conn *netlink.Conn
	im   Impairment
	rng  *rand.Rand

	mu      sync.Mutex
	held    heldHeap
	last    map[string]time.Time // per flow, the latest release time
	wake    chan struct{}
	closing bool
	done    chan struct{} // receive has returned
	drained chan struct{} // release has accepted what was held and returned
	loopErr error
	stats   QueueStats
}

// QueueStats counts what a Degrade fault did to the packets it saw.
type QueueStats struct {
	Packets, Dropped, Delayed int64
}

type heldPacket struct {
	id      uint32
	release time.Time
	seq     uint64 // ties broken in arrival order
}

type heldHeap []heldPacket

func (h heldHeap) Len() int { return len(h) }
func (h heldHeap) Less(i, j int) bool {
	if !h[i].release.Equal(h[j].release) {
		return h[i].release.Before(h[j].release)
	}
	return h[i].seq < h[j].seq
}
func (h heldHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *heldHeap) Push(x any)   { *h = append(*h, x.(heldPacket)) }
func (h *heldHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// openQueue binds the first free queue number from a base derived from
// pid and starts handing verdicts.
func openQueue(pid int, im Impairment) (*queue, error) {
	base := 1000 + (pid*17)%50000
	var lastErr error
	for i := range 64 {
		num := uint16(base + i)
		q, err := bindQueue(num, im)
		if err == nil {
			return q, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("netfault: no free NFQUEUE number from %d: %w", base, lastErr)
}

func bindQueue(num uint16, im Impairment) (*queue, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	// Room for a burst of packets without the kernel dropping them for a
	// full socket buffer.
	_ = c.SetReadBuffer(16 << 20)
	_ = c.SetOption(netlink.NoENOBUFS, true)
	cfg := func(attrs ...netfilter.Attribute) error {
		m, err := netfilter.MarshalNetlink(netfilter.Header{
			SubsystemID: netfilter.NFSubsysQueue, MessageType: nfqnlMsgConfig,
			Family: unix.AF_UNSPEC, ResourceID: num,
			Flags: netlink.Request | netlink.Acknowledge,
		}, attrs)
		if err != nil {
			return err
		}
		_, err = c.Execute(m)
		return err
	}
	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params, headerBytes)
	params[4] = nfqnlCopyPacket
	flags := binary.BigEndian.AppendUint32(nil, nfqaCfgFFailOpen)
	if err := cfg(netfilter.Attribute{Type: nfqaCfgCmd, Data: []byte{nfqnlCfgCmdBind, 0, 0, unix.AF_INET}}); err != nil {
		c.Close()
		return nil, fmt.Errorf("bind queue %d: %w", num, err)
	}
	if err := cfg(
		netfilter.Attribute{Type: nfqaCfgParams, Data: params},
		netfilter.Attribute{Type: nfqaCfgQueueMax, Data: binary.BigEndian.AppendUint32(nil, queueMaxLen)},
		netfilter.Attribute{Type: nfqaCfgFlags, Data: flags},
		netfilter.Attribute{Type: nfqaCfgMask, Data: flags},
	); err != nil {
		c.Close()
		return nil, fmt.Errorf("configure queue %d: %w", num, err)
	}
	q := &queue{num: num, conn: c, im: im, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(num))),
		last: map[string]time.Time{}, wake: make(chan struct{}, 1), done: make(chan struct{}), drained: make(chan struct{})}
	go q.receive()
	go q.release()
	return q, nil
}

// receive reads the queued packets and decides each one's fate.
func (q *queue) receive() {
	defer close(q.done)
	var seq uint64
	for {
		msgs, err := q.conn.Receive()
		q.mu.Lock()
		closing := q.closing
		q.mu.Unlock()
		if closing {
			return
		}
		if err != nil {
			// A verdict for a packet the kernel no longer holds comes
			// back as an error; the socket itself keeps working.
			var oe *netlink.OpError
			if errors.As(err, &oe) && !errors.Is(err, unix.EBADF) {
				continue
			}
			q.mu.Lock()
			q.loopErr = err
			q.mu.Unlock()
			return
		}
		now := time.Now()
		for _, m := range msgs {
			h, attrs, err := netfilter.UnmarshalNetlink(m)
			if err != nil || h.SubsystemID != netfilter.NFSubsysQueue || h.MessageType != nfqnlMsgPacket {
				continue
			}
			var id uint32
			var payload []byte
			for _, a := range attrs {
				switch a.Type {
				case nfqaPacketHdr:
					if len(a.Data) >= 4 {
						id = binary.BigEndian.Uint32(a.Data)
					}
				case nfqaPayload:
					payload = a.Data
				}
			}
			q.mu.Lock()
			if q.closing {
				q.mu.Unlock()
				q.verdict(id, nfAccept)
				continue
			}
			q.stats.Packets++
			if q.im.Loss > 0 && q.rng.Float64() < q.im.Loss {
				q.stats.Dropped++
				q.mu.Unlock()
				q.verdict(id, nfDrop)
				continue
			}
			d := q.im.Delay
			if q.im.Jitter > 0 {
				d += time.Duration(q.rng.Int64N(int64(q.im.Jitter)))
			}
			release := now.Add(d)
			key := flowKey(payload)
			if prev := q.last[key]; release.Before(prev) {
				release = prev
			}
			q.last[key] = release
			seq++
			heap.Push(&q.held, heldPacket{id: id, release: release, seq: seq})
			q.stats.Delayed++
			q.mu.Unlock()
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
	}
}

// release accepts each held packet at its release time, and all of them
// at once when the queue closes.
func (q *queue) release() {
	defer close(q.drained)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		q.mu.Lock()
		var due []uint32
		now := time.Now()
		for q.held.Len() > 0 && (q.closing || !q.held[0].release.After(now)) {
			due = append(due, heap.Pop(&q.held).(heldPacket).id)
		}
		next := time.Duration(-1)
		if q.held.Len() > 0 {
			next = q.held[0].release.Sub(now)
		}
		closing := q.closing
		q.mu.Unlock()
		for _, id := range due {
			q.verdict(id, nfAccept)
		}
		if closing {
			return
		}
		if next < 0 {
			next = time.Hour
		}
		timer.Reset(next)
		select {
		case <-timer.C:
		case <-q.wake:
		}
	}
}

func (q *queue) verdict(id uint32, verdict uint32) {
	hdr := make([]byte, 8)
	binary.BigEndian.PutUint32(hdr, verdict)
	binary.BigEndian.PutUint32(hdr[4:], id)
	m, err := netfilter.MarshalNetlink(netfilter.Header{
		SubsystemID: netfilter.NFSubsysQueue, MessageType: nfqnlMsgVerdict,
		Family: unix.AF_UNSPEC, ResourceID: q.num, Flags: netlink.Request,
	}, []netfilter.Attribute{{Type: nfqaVerdictHdr, Data: hdr}})
	if err == nil {
		_, _ = q.conn.Send(m)
	}
}

// close accepts every held packet, then unbinds the queue (closing the
// socket). Its rules must be gone already, so no packet is queued after.
func (q *queue) close() (QueueStats, error) {
	q.mu.Lock()
	q.closing = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	<-q.drained // what arrives from now on is accepted at once
	err := q.conn.Close()
	<-q.done
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.loopErr != nil && !errors.Is(q.loopErr, unix.EBADF) {
		err = errors.Join(err, q.loopErr)
	}
	return q.stats, err
}

// flowKey is a packet's IPv4 addresses and TCP ports; packets with the
// same key keep their order through the delay.
func flowKey(p []byte) string {
	if len(p) < 20 || p[0]>>4 != 4 {
		return ""
	}
	ihl := int(p[0]&0x0f) * 4
	if len(p) < ihl+4 {
		return string(p[12:20])
	}
	return string(p[12:20]) + string(p[ihl:ihl+4])
}
