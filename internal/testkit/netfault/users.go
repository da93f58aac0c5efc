package netfault

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// PoolSize is how many pool users scripts/setup-machine creates.
const PoolSize = 16

// User is a Unix user of the pool whose processes a Link selects.
type User struct {
	Name     string
	UID, GID uint32
}

// claimed is a user this run holds.
type claimed struct {
	User
	lock *os.File
}

// Capabilities a pool user's process keeps: it reads and writes files as
// root would (the Kafka class path under /root/.m2, a test's 0700 temp
// directory), so the user changes only how the network sees it.
const (
	capDACOverride   = 1 // CAP_DAC_OVERRIDE
	capDACReadSearch = 2 // CAP_DAC_READ_SEARCH
)

// SysProcAttr runs a child process as u (exec.Cmd.SysProcAttr), keeping
// the file capabilities above; its supplementary groups are cleared.
func (u User) SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: u.UID, Gid: u.GID},
		AmbientCaps: []uintptr{capDACOverride, capDACReadSearch},
	}
}

// User claims a pool user no other run holds and no process runs as, for
// one process (or a set of processes that always fail together). It is
// this run's until Close.
func (n *Net) User() (User, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return User{}, errors.New("netfault: closed")
	}
	busy, err := uidsInUse()
	if err != nil {
		return User{}, err
	}
	for i := range PoolSize {
		name := fmt.Sprintf("%s%02d", UserPrefix, i)
		u, err := lookup(name)
		if err != nil {
			return User{}, fmt.Errorf("netfault: pool user %s: %w (scripts/setup-machine creates %s00 to %s%02d)", name, err, UserPrefix, UserPrefix, PoolSize-1)
		}
		if busy[u.UID] {
			continue
		}
		lock, err := lockFile(filepath.Join(LockDir, "user-"+name+".lock"), true)
		if errors.Is(err, errLocked) {
			continue
		}
		if err != nil {
			return User{}, err
		}
		n.users = append(n.users, &claimed{User: u, lock: lock})
		return u, nil
	}
	return User{}, fmt.Errorf("netfault: all %d pool users are taken by other runs or their processes", PoolSize)
}

func lookup(name string) (User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return User{}, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return User{}, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return User{}, err
	}
	return User{Name: name, UID: uint32(uid), GID: uint32(gid)}, nil
}

// uidsInUse returns the real user IDs of the running processes.
func uidsInUse() (map[uint32]bool, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	uids := map[uint32]bool{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					if uid, err := strconv.ParseUint(f[0], 10, 32); err == nil {
						uids[uint32(uid)] = true
					}
				}
				break
			}
		}
	}
	return uids, nil
}
