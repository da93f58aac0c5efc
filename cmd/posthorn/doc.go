// Command posthorn is the transactional-outbox relay and the tools around
// it in one binary: the Posting API (api), the relay (relay), the example
// consumers (consume), the operator's commands (outbox, reconcile, replay,
// archive, cleanup, retention), schema setup (migrate), a local
// Kafka-protocol broker (dev kafka) and the all-in-one demo (demo).
//
// Every subcommand has the same shape and its own file (the demo, the
// longest, one per phase: demo.go and demo_*.go): it declares its flags
// (newFlags), makes one call to start, which parses them, loads the
// configuration, runs the command's flag checks, builds the logger and
// opens the pools, archive, sink and metrics registry the command needs,
// and then does its own work; main.go holds the table of subcommands, the
// dispatch and the signal handling. The first SIGINT or SIGTERM cancels the
// command's context, so long-running commands stop softly; a second exits
// at once.
//
// This package is the edge where configuration is mapped: koanf and
// configs.Config end here. The business packages (core, api, relay, ops
// and the consumers' middleware) receive plain Config structs and stores
// that this package fills in (the relay's settings are relay.Settings,
// decoded by configs as they are), and never import configs; besides this
// package, only the broker wiring that turns configs.Sink into a sink or
// subscribers (adapters/brokers) reads it.
package main
