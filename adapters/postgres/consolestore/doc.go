// Package consolestore is the operator console's store (console.Store): the
// relay's and the consumers' status, the CDC slot, the two releases and the
// console's audit log, over the relay store, the CDC source and the inbox.
//
// Invariant: it reads and releases by the very methods the CLI's status and
// release commands call, so the console shows and does what they do.
package consolestore
