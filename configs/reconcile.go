package configs

import "fmt"

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
	}
	return nil
}
