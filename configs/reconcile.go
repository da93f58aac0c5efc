package configs

import (
	"fmt"
	"regexp"

	"github.com/posthorn/posthorn/ops"
)

// topicRE is an outbox topic as the writers make them: ledger.events,
// events.<aggregate type>, <prefix><service>.
var topicRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// Reconcile configures reconciliation by cut.
type Reconcile struct {
	// Consumers whose dispositions are read; empty means the two example
	// consumers on consumer.database.url.
	Consumers []ReconcileConsumer `koanf:"consumers"`
}

// ReconcileConsumer names one consumer and a read-only DSN of its inbox.
type ReconcileConsumer struct {
	Name        string `koanf:"name"`
	DatabaseURL string `koanf:"database_url"`
	// RejectedFinal makes `rejected` a final disposition for this consumer:
	// set it only for a consumer that by design rejects events it does not
	// handle. Otherwise a rejected event is unproven (exit 1, no coverage).
	RejectedFinal bool `koanf:"rejected_final"`
	// Topics are the outbox topics the consumer subscribes to: the cut's
	// rows on them are matched against its dispositions. Empty means
	// ledger.events.
	Topics []string `koanf:"topics"`
	// BalanceView names a table or view in the consumer's database with
	// columns account, currency, balance, revision, held against the
	// ledger's journal (empty: none).
	BalanceView string `koanf:"balance_view"`
}

func (r Reconcile) validate() error {
	for i, c := range r.Consumers {
		if c.Name == "" {
			return fieldErr(fmt.Sprintf("reconcile.consumers[%d].name", i), "is required")
		}
		key := fmt.Sprintf("reconcile.consumers[%d].database_url", i)
		if c.DatabaseURL == "" {
			return fieldErr(key, "is required")
		}
		if err := validateURL(key, c.DatabaseURL); err != nil {
			return err
		}
		for j, t := range c.Topics {
			if !topicRE.MatchString(t) {
				return fieldErr(fmt.Sprintf("reconcile.consumers[%d].topics[%d]", i, j), "is %q, want an outbox topic such as ledger.events (1 to 249 letters, digits, '.', '_' or '-')", t)
			}
		}
		if c.BalanceView != "" && !ops.ValidBalanceView(c.BalanceView) {
			return fieldErr(fmt.Sprintf("reconcile.consumers[%d].balance_view", i), "is %q, want a table or view name such as projection_balances or reporting.balances", c.BalanceView)
		}
	}
	return nil
}
