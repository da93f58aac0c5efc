// Package promset builds a component's Prometheus collectors and registers
// them together, so that a component states each series in one line (its
// name and help are fixed by contract.md) and registration is written once.
package promset

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Set collects the collectors it creates until Register. ConstLabels, if
// set before the first collector is made, go on every one of them.
type Set struct {
	ConstLabels prometheus.Labels
	cs          []prometheus.Collector
}

func add[C prometheus.Collector](s *Set, c C) C {
	s.cs = append(s.cs, c)
	return c
}

// Gauge makes a gauge.
func (s *Set) Gauge(name, help string) prometheus.Gauge {
	return add(s, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: s.ConstLabels}))
}

// Counter makes a counter.
func (s *Set) Counter(name, help string) prometheus.Counter {
	return add(s, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: s.ConstLabels}))
}

// Histogram makes a histogram with buckets.
func (s *Set) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return add(s, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets,
		ConstLabels: s.ConstLabels}))
}

// GaugeVec makes a gauge vector over labels.
func (s *Set) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return add(s, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: s.ConstLabels}, labels))
}

// CounterVec makes a counter vector over labels.
func (s *Set) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return add(s, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: s.ConstLabels}, labels))
}

// HistogramVec makes a histogram vector over labels with buckets.
func (s *Set) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return add(s, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets,
		ConstLabels: s.ConstLabels}, labels))
}

// Register registers every collector made so far on reg, in the order they
// were made, and stops at the first error; a nil reg registers nothing.
func (s *Set) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range s.cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Register registers c on reg, or returns the collector of the same type
// already registered under its name, so that several instances in one
// process (as in tests) can share one registerer. Any other error is
// returned.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}
