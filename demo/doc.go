// Package demo holds the workload and the end-to-end checks shared by
// `posthorn demo` and the fault suite (integration/fault_test.go): random
// balanced transfers posted through the Posting API (Load), a cheap
// delivery probe to wait on (ReadProgress), and Verify, which checks with
// SQL over the ledger and the consumer database that every committed event
// was relayed and applied exactly once per consumer, in revision order per
// account with no gap, that nothing unknown or rolled back was applied, and
// that the projection's balances equal the ledger's.
//
// Verify reads whole tables: it is a tool for demos and tests, not for
// production sizes (that is `posthorn reconcile`, which works by cut).
package demo
