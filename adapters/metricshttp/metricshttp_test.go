package metricshttp

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/posthorn/posthorn/internal/testkit/promtest"
)

func TestServesMetricsHealthAndReadiness(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "posthorn_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var ready atomic.Bool
	s, err := Start("127.0.0.1:0", reg, func() error {
		if !ready.Load() {
			return errors.New("no lease yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr()
	if code, body := promtest.Get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "posthorn_test_total 3") {
		t.Fatalf("/metrics = %d %q", code, body)
	}
	if code, _ := promtest.Get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, body := promtest.Get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "no lease yet") {
		t.Fatalf("/readyz not ready = %d %q", code, body)
	}
	ready.Store(true)
	if code, _ := promtest.Get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz ready = %d", code)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
