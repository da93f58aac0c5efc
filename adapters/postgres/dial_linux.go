package postgres

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// userTimeoutControl sets TCP_USER_TIMEOUT on TCP sockets (not on Unix
// sockets, which have no network to lose); zero sets nothing.
func userTimeoutControl(timeout time.Duration) func(network, address string, c syscall.RawConn) error {
	if timeout == 0 {
		return nil
	}
	return func(network, _ string, c syscall.RawConn) error {
		if network != "tcp" && network != "tcp4" && network != "tcp6" {
			return nil
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(timeout.Milliseconds()))
		})
		if err != nil {
			return err
		}
		return serr
	}
}
