package postgres

// ScramVerifierForTest exposes scramVerifier with a given salt, so a test
// can compare it with the verifier PostgreSQL computes.
var ScramVerifierForTest = scramVerifier
