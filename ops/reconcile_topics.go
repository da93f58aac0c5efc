package ops

import (
	"slices"
	"sort"

	"github.com/posthorn/posthorn/core"
)

// The cut is over the outbox itself: every row of the cut, whoever wrote it
// (the Posting API, the publish library, the SQL functions), is matched
// against every configured consumer that subscribes to its topic
// (ConsumerSource.Topics). An event no configured consumer subscribes to
// is named (UnwatchedTopics, Report.Unwatched), never counted as covered:
// the coverage recorded stops below the first of them. A command no
// consumer is configured for is listed but is no discrepancy: a command
// is addressed to one service, whose handler reconcile reads only when it
// is configured as a consumer of the command's topic.

// UnwatchedTopic counts the cut's rows on a topic that no configured
// consumer subscribes to.
type UnwatchedTopic struct {
	Topic string `json:"topic"`
	// Kind is event (a discrepancy) or command (listed only).
	Kind          string `json:"kind"`
	Rows          int64  `json:"rows"`
	FirstOutboxID int64  `json:"first_outbox_id"`
}

// topicsOf returns the topics c subscribes to: its own, or the ledger's
// events topic when it names none.
func topicsOf(c ConsumerSource) []string {
	if len(c.Topics) == 0 {
		return []string{core.TopicEvents}
	}
	return c.Topics
}

// route returns, for each consumer, the positions in batch of the rows on
// its topics, and tallies the rows on topics no consumer subscribes to.
func (m *matching) route(batch []ExpectedEvent) [][]int {
	out := make([][]int, len(m.cfg.Consumers))
	for i, e := range batch {
		watched := false
		for ci, c := range m.cfg.Consumers {
			if slices.Contains(topicsOf(c), e.Topic) {
				out[ci] = append(out[ci], i)
				watched = true
			}
		}
		if !watched {
			m.unwatchedRow(e)
		}
		m.lastID = e.ID
	}
	return out
}

// unwatchedRow tallies a row no consumer subscribes to.
func (m *matching) unwatchedRow(e ExpectedEvent) {
	if m.unwatchedTopics == nil {
		m.unwatchedTopics = map[[2]string]*UnwatchedTopic{}
	}
	k := [2]string{e.Topic, e.Kind}
	u := m.unwatchedTopics[k]
	if u == nil {
		u = &UnwatchedTopic{Topic: e.Topic, Kind: e.Kind, FirstOutboxID: e.ID}
		m.unwatchedTopics[k] = u
	}
	u.Rows++
	u.FirstOutboxID = min(u.FirstOutboxID, e.ID)
	if e.Kind == string(core.KindEvent) {
		m.unwatched.add(m.cfg.Cap, e.EventID)
		if m.firstUnwatched == 0 {
			m.firstUnwatched, m.beforeUnwatched = e.ID, m.lastID
		}
	}
}

// unwatchedList is the tally of route, by topic and kind.
func (m *matching) unwatchedList() []UnwatchedTopic {
	out := make([]UnwatchedTopic, 0, len(m.unwatchedTopics))
	for _, u := range m.unwatchedTopics {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}
