//go:build !linux

package postgres

import (
	"syscall"
	"time"
)

// userTimeoutControl sets nothing where TCP_USER_TIMEOUT does not exist:
// the keep-alive probes alone find a silent server there.
func userTimeoutControl(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
