package postgres

// NotifyChannel is the LISTEN channel on which the ledger store announces,
// after commit, that new outbox rows exist (the payload is empty).
const NotifyChannel = "posthorn_outbox"

// RelayApplicationName is the application_name the relay's sessions should
// carry, so the open-transaction gauge does not count the relay itself.
const RelayApplicationName = "posthorn-relay"
