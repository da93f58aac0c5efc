// Package cdc is the CDC relay's former home, kept so that existing
// callers compile: every name here is an alias of its new home.
//
// Deprecated: the CDC relay is package github.com/posthorn/posthorn/relay/cdc
// and its settings are relay.Settings, whose CDC section holds Slot,
// Publication, HeartbeatInterval, StatusInterval and BatchLinger; the test
// hooks moved out of the settings (cdc.NewWithHooks).
package cdc

import (
	"github.com/posthorn/posthorn/relay"
	"github.com/posthorn/posthorn/relay/cdc"
)

// Deprecated: use the names in package relay/cdc (Config: relay.Settings).
type (
	Config      = relay.Settings
	Relay       = cdc.Relay
	Hooks       = cdc.Hooks
	Source      = cdc.Source
	OutboxStore = cdc.OutboxStore
	Stream      = cdc.Stream
	LSN         = cdc.LSN
	Lease       = cdc.Lease
	SlotStatus  = cdc.SlotStatus
	EventKind   = cdc.EventKind
	Event       = cdc.Event
)

// Deprecated: use relay/cdc.New and relay/cdc.NewWithHooks.
var (
	New          = cdc.New
	NewWithHooks = cdc.NewWithHooks
)

// Deprecated: use the names in package relay/cdc or relay.
var (
	ErrInterrupted    = cdc.ErrInterrupted
	ErrNotAvailable   = cdc.ErrNotAvailable
	ErrSlotInUse      = cdc.ErrSlotInUse
	ErrInvalidConfig  = relay.ErrInvalidConfig
	ErrAlreadyStarted = relay.ErrAlreadyStarted
)

// Deprecated: use the constants in package relay/cdc or relay.
const (
	EventNone      = cdc.EventNone
	EventBegin     = cdc.EventBegin
	EventRow       = cdc.EventRow
	EventCommit    = cdc.EventCommit
	EventHeartbeat = cdc.EventHeartbeat
	EventKeepalive = cdc.EventKeepalive

	SlotDefault              = relay.SlotDefault
	PublicationDefault       = relay.PublicationDefault
	BatchLingerDefault       = relay.BatchLingerDefault
	StatusIntervalDefault    = relay.StatusIntervalDefault
	HeartbeatIntervalDefault = relay.HeartbeatIntervalDefault
)
