package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartStandby makes an asynchronous physical standby of c and starts it:
// pg_basebackup -R over a new physical replication slot named name on c
// (so c keeps the WAL the standby has not received yet, also while it is
// shut down), with cluster_name name, which is the application_name c's
// pg_stat_replication shows for it. The standby takes c's Options; it is
// synchronous only if c's synchronous_standby_names names it. name must be
// a plain identifier (lower-case letters, digits, _).
func (c *Cluster) StartStandby(ctx context.Context, name string) (*Cluster, error) {
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return nil, fmt.Errorf("pgcluster: standby name %q: want lower-case letters, digits and _", name)
		}
	}
	if name == "" {
		return nil, fmt.Errorf("pgcluster: standby name is empty")
	}
	s := &Cluster{pgCtl: c.pgCtl, log: c.log, bin: c.bin, user: c.user, asUser: c.asUser, uid: c.uid, gid: c.gid}
	s.opts = c.opts
	s.opts.ExtraConf = map[string]string{}
	for k, v := range c.opts.ExtraConf {
		s.opts.ExtraConf[k] = v
	}
	s.opts.ExtraConf["cluster_name"] = name
	dir, err := os.MkdirTemp("", "posthorn-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	s.dir, s.dataDir = dir, filepath.Join(dir, "data")
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if s.uid >= 0 {
		if err := os.Chown(dir, s.uid, s.gid); err != nil {
			return nil, fmt.Errorf("pgcluster: hand %s to postgres: %w", dir, err)
		}
	}
	basebackup := "pg_basebackup"
	if c.bin != "" {
		basebackup = filepath.Join(c.bin, "pg_basebackup")
	}
	conn := fmt.Sprintf("host=127.0.0.1 port=%d user=%s", c.port, c.user)
	if out, err := s.run(ctx, basebackup, "-D", s.dataDir, "-d", conn, "-R", "-X", "stream",
		"-C", "-S", name, "--no-sync", "-c", "fast"); err != nil {
		return nil, fmt.Errorf("pgcluster: pg_basebackup: %w\n%s", err, out)
	}
	var startErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: find a free port: %w", err)
		}
		s.port = port
		// The copy holds c's posthorn.conf (its port and socket directory):
		// overwrite it with the standby's own.
		if err := s.writeConf(s.opts, s.uid, s.gid); err != nil {
			return nil, err
		}
		if startErr = s.start(ctx); startErr == nil {
			ok = true
			return s, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	_, _ = s.run(context.Background(), s.pgCtl, "stop", "-D", s.dataDir, "-m", "immediate", "-w")
	return nil, startErr
}

// start runs pg_ctl start and waits until the server accepts connections.
func (c *Cluster) start(ctx context.Context) error {
	out, err := c.run(ctx, c.pgCtl, "start", "-w", "-t", "60", "-D", c.dataDir, "-l", c.LogFile())
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl start: %w\n%s\nserver log:\n%s", err, out, tail(c.LogFile(), 4096))
	}
	c.mu.Lock()
	c.down = false
	c.mu.Unlock()
	return nil
}

// Shutdown stops the server cleanly (pg_ctl stop -m fast) and keeps its
// directory, so Restart can start it again: a standby that is down.
func (c *Cluster) Shutdown(ctx context.Context) error {
	if out, err := c.run(ctx, c.pgCtl, "stop", "-D", c.dataDir, "-m", "fast", "-w"); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop: %w\n%s", err, out)
	}
	c.mu.Lock()
	c.down = true
	c.mu.Unlock()
	return nil
}

// Restart starts a server that Shutdown or Kill ended, on the same port and
// data directory (after Kill it runs crash recovery first).
func (c *Cluster) Restart(ctx context.Context) error { return c.start(ctx) }

// Kill sends SIGKILL to the postmaster, as a crash of the machine's
// database process would end it: no shutdown checkpoint, no last WAL sent
// to standbys. Its backends notice and exit on their own.
func (c *Cluster) Kill() error {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pgcluster: read postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return fmt.Errorf("pgcluster: postmaster.pid holds no process ID: %q", first)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgcluster: kill postmaster %d: %w", pid, err)
	}
	c.mu.Lock()
	c.down = true
	c.mu.Unlock()
	// Until the postmaster is reaped, the port may still take connections.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if err := syscall.Kill(pid, 0); err != nil || isZombie(pid) {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // polling a process's exit
	}
	return fmt.Errorf("pgcluster: postmaster %d still runs 10s after SIGKILL", pid)
}

// Promote ends recovery on a standby (pg_ctl promote -w): it becomes a
// primary on a new timeline, holding exactly the WAL it had received.
func (c *Cluster) Promote(ctx context.Context) error {
	if out, err := c.run(ctx, c.pgCtl, "promote", "-w", "-t", "60", "-D", c.dataDir); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// isZombie reports whether pid has exited but was not reaped yet (a
// container's init may never reap it).
func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state …: comm may hold spaces, the state follows its ')'.
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && strings.HasPrefix(rest, "Z")
}
