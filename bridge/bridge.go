// Package bridge is the relay's former home, kept so that existing callers
// compile: every name here is an alias of its new home.
//
// Deprecated: the shared vocabulary and the settings of both modes are in
// package github.com/posthorn/posthorn/relay, the polling relay in
// github.com/posthorn/posthorn/relay/polling, the CDC relay in
// github.com/posthorn/posthorn/relay/cdc. Config is relay.Settings: the
// test hooks moved out of it (polling.NewWithHooks), and a zero
// ParkAfterAttempts or ParkAfter now turns that bound off, as in the
// configuration (relay.Defaults has the defaults).
package bridge

import (
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/polling"
)

// Deprecated: use the names in package relay.
type (
	Config        = relay.Settings
	StandbyFlush  = relay.StandbyFlush
	StandbyProbe  = relay.StandbyProbe
	StandbyStatus = relay.StandbyStatus
	Standby       = relay.Standby
	LSN           = relay.LSN
	HistoryGate   = relay.HistoryGate
	FencedSink    = relay.FencedSink
	PublishFunc   = relay.PublishFunc
	Around        = relay.Around
)

// Deprecated: use the names in package relay/polling.
type (
	Relay = polling.Relay
	Store = polling.Store
	Hooks = polling.Hooks
)

// Deprecated: use relay/polling.New and relay/polling.NewWithHooks.
var (
	New          = polling.New
	NewWithHooks = polling.NewWithHooks
)

// Deprecated: use the names in package relay.
var (
	Wrap             = relay.Wrap
	Formatted        = relay.Formatted
	CheckStandbys    = relay.CheckStandbys
	DefaultOwner     = relay.DefaultOwner
	ErrInvalidConfig = relay.ErrInvalidConfig
	// ErrAlreadyStarted is returned by a relay's second Start.
	ErrAlreadyStarted = relay.ErrAlreadyStarted
)

// Deprecated: use the constants in package relay.
const (
	BatchSizeDefault         = relay.BatchSizeDefault
	PollIntervalDefault      = relay.PollIntervalDefault
	MinPollIntervalDefault   = relay.MinPollIntervalDefault
	LeaseTTLDefault          = relay.LeaseTTLDefault
	RetryInitialDefault      = relay.RetryInitialDefault
	RetryMaxDefault          = relay.RetryMaxDefault
	StatsIntervalDefault     = relay.StatsIntervalDefault
	ParkAfterAttemptsDefault = relay.ParkAfterAttemptsDefault
	ParkAfterDefault         = relay.ParkAfterDefault
	StandbyPollMaxDefault    = relay.StandbyPollMaxDefault
	StandbyWarnAfterDefault  = relay.StandbyWarnAfterDefault
)
