// Package pgcluster starts a throwaway PostgreSQL cluster for the demo and
// for tests that need server settings a shared server cannot give them
// (logical replication for CDC, a small max_slot_wal_keep_size to lose a
// slot on purpose).
//
// Invariants:
//
//   - Everything the cluster owns lives under one temporary directory: the
//     data directory, the Unix socket and the server log. Stop kills the
//     server (pg_ctl stop -m immediate: a throwaway needs no checkpoint) and
//     removes that directory, so nothing outlives it but a server whose
//     owner died without calling Stop.
//   - The server listens on 127.0.0.1 only, on a port that was free when
//     Start chose it, with trust authentication: never expose it.
//   - initdb and pg_ctl refuse to run as root. When the process runs as
//     root (CI does), they run as the postgres OS user through runuser, the
//     temporary directory is handed to that user, and the cluster's
//     superuser is postgres; otherwise they run as the current user, who is
//     then the superuser. URL always names the right one.
//   - fsync is off: a crash of the machine loses the cluster, which is the
//     point of a throwaway.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoBinaries is returned by Start when neither PATH nor
// /usr/lib/postgresql/<version>/bin has initdb and pg_ctl.
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/<version>/bin; install them, e.g. `apt-get install -y postgresql` on Debian")

// debianRoot is where Debian's postgresql-N packages put the server
// binaries, off PATH.
var debianRoot = "/usr/lib/postgresql"

// Options configure Start. The zero value is a plain cluster.
type Options struct {
	// Logical sets wal_level=logical with room for replication slots and
	// WAL senders, for the CDC relay.
	Logical bool
	// MaxSlotWALKeepSize sets max_slot_wal_keep_size (e.g. "64MB"), so a
	// test can make the server invalidate a slot that lags too far.
	MaxSlotWALKeepSize string
	// ExtraConf holds further postgresql.conf settings; they win over the
	// ones above.
	ExtraConf map[string]string
	// Log receives the output of initdb and pg_ctl; nil discards it. The
	// server's own log is in LogFile.
	Log io.Writer
}

// Cluster is a running throwaway cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	dir      string // the temporary directory; removed by Stop
	dataDir  string
	port     int
	user     string
	pgCtl    string
	asUser   string // non-empty: run pg_ctl through runuser as this user
	uid, gid int    // the server's OS user when asUser is set, else -1
	bin      string // the directory of the server binaries; "" means PATH
	opts     Options
	log      io.Writer
	stopOnce sync.Once
	stopErr  error

	mu   sync.Mutex
	down bool // the server was killed or shut down (Kill, Shutdown)
}

// Start initialises a cluster in a new temporary directory and starts it,
// returning once it accepts connections (about two seconds here). ctx
// bounds initdb and the start; once Start returns, the server runs until
// Stop, whatever happens to ctx. On error nothing is left behind.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	c := &Cluster{pgCtl: filepath.Join(bin, "pg_ctl"), log: logw, bin: bin, opts: opts, uid: -1, gid: -1}
	if bin == "" {
		c.pgCtl = "pg_ctl"
	}
	initdb := filepath.Join(bin, "initdb")
	if bin == "" {
		initdb = "initdb"
	}

	var uid, gid = -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgcluster: running as root, so initdb must run as the postgres user, which does not exist (%v); install Debian's postgresql package or run as an ordinary user", err)
		}
		if _, err := exec.LookPath("runuser"); err != nil {
			return nil, fmt.Errorf("pgcluster: running as root needs runuser (util-linux) to run initdb as postgres: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.asUser, c.user = "postgres", "postgres"
		c.uid, c.gid = uid, gid
	} else {
		u, err := user.Current()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: current user: %w", err)
		}
		c.user = u.Username
	}

	dir, err := os.MkdirTemp("", "posthorn-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c.dir = dir
	c.dataDir = filepath.Join(dir, "data")
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if uid >= 0 {
		// The postgres user must own the directory initdb creates the data
		// directory in, and where the socket and the log go.
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("pgcluster: hand %s to postgres: %w", dir, err)
		}
	}

	if out, err := c.run(ctx, initdb, "-D", c.dataDir, "-U", c.user, "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
		hint := ""
		if c.asUser != "" {
			hint = fmt.Sprintf(" (initdb runs as %s, who must be able to reach %s: every parent directory needs search permission for it; point TMPDIR elsewhere if not)", c.asUser, dir)
		}
		return nil, fmt.Errorf("pgcluster: initdb%s: %w\n%s", hint, err, out)
	}

	// Settings go into a file of our own that postgresql.conf includes,
	// not into pg_ctl -o: pg_ctl hands -o to a shell, and ExtraConf values
	// may hold spaces or quotes.
	conf := filepath.Join(c.dataDir, "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	_, err = fmt.Fprintf(f, "\ninclude 'posthorn.conf'\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}

	// A port found free can be taken before the server binds it; try a
	// new one a few times rather than fail the caller.
	var startErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: find a free port: %w", err)
		}
		c.port = port
		if err := c.writeConf(opts, uid, gid); err != nil {
			return nil, err
		}
		if startErr = c.start(ctx); startErr == nil {
			ok = true
			return c, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	// pg_ctl -w may give up while a postmaster still runs.
	_, _ = c.run(context.Background(), c.pgCtl, "stop", "-D", c.dataDir, "-m", "immediate", "-w")
	return nil, startErr
}

// writeConf writes posthorn.conf, owned by the server's user.
func (c *Cluster) writeConf(opts Options, uid, gid int) error {
	set := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(c.port),
		"unix_socket_directories": c.dir,
		"fsync":                   "off",
		"synchronous_commit":      "off",
		"full_page_writes":        "off",
	}
	if opts.Logical {
		set["wal_level"] = "logical"
		set["max_replication_slots"] = "10"
		set["max_wal_senders"] = "10"
	}
	if opts.MaxSlotWALKeepSize != "" {
		set["max_slot_wal_keep_size"] = opts.MaxSlotWALKeepSize
	}
	for k, v := range opts.ExtraConf {
		set[k] = v
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# written by posthorn's pgcluster\n")
	for _, k := range keys {
		// Every GUC accepts a quoted value; quoting all of them means
		// ExtraConf needs no knowledge of the setting's type.
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(set[k], "'", "''"))
	}
	path := filepath.Join(c.dataDir, "posthorn.conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if uid >= 0 {
		if err := os.Chown(path, uid, gid); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}

// run runs a PostgreSQL tool, as the postgres user when c.asUser says so,
// from inside the cluster's directory (the tools fail when they cannot read
// their working directory, which the postgres user often cannot).
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if c.asUser != "" {
		args = append([]string{"-u", c.asUser, "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	var out bytes.Buffer
	w := io.MultiWriter(&out, c.log)
	cmd.Stdout, cmd.Stderr = w, w
	// pg_ctl start leaves the postmaster holding its stdout and stderr;
	// without a bound, Wait would wait for the server to exit.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil
	}
	return out.Bytes(), err
}

// URL returns a DSN for database db (e.g. "postgres") as the cluster's
// superuser over TCP.
func (c *Cluster) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(c.user),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port is the TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// User is the cluster's superuser: the OS user that ran initdb.
func (c *Cluster) User() string { return c.user }

// Dir is the temporary directory holding the data directory ("data"), the
// Unix socket and the server log.
func (c *Cluster) Dir() string { return c.dir }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogFile is the server's log.
func (c *Cluster) LogFile() string { return filepath.Join(c.dir, "postgres.log") }

// Stop kills the server without a checkpoint (unless Kill or Shutdown
// already ended it) and removes the temporary directory. It is idempotent;
// later calls return the first result. The
// directory is removed even if pg_ctl fails (the server may already be
// dead), and that failure is returned.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.mu.Lock()
		down := c.down
		c.mu.Unlock()
		if !down {
			out, err := c.run(ctx, c.pgCtl, "stop", "-D", c.dataDir, "-m", "immediate", "-w")
			if err != nil {
				c.stopErr = fmt.Errorf("pgcluster: pg_ctl stop: %w\n%s", err, out)
			}
		}
		if err := os.RemoveAll(c.dir); err != nil && c.stopErr == nil {
			c.stopErr = fmt.Errorf("pgcluster: %w", err)
		}
	})
	return c.stopErr
}

// findBinaries returns the directory of initdb and pg_ctl, or "" when both
// are on PATH.
func findBinaries() (string, error) {
	_, e1 := exec.LookPath("initdb")
	_, e2 := exec.LookPath("pg_ctl")
	if e1 == nil && e2 == nil {
		return "", nil
	}
	entries, _ := os.ReadDir(debianRoot)
	best, bestVer := "", -1.0
	for _, e := range entries {
		v, err := strconv.ParseFloat(e.Name(), 64) // "15", "9.6"
		if err != nil || v <= bestVer {
			continue
		}
		bin := filepath.Join(debianRoot, e.Name(), "bin")
		if isExec(filepath.Join(bin, "initdb")) && isExec(filepath.Join(bin, "pg_ctl")) {
			best, bestVer = bin, v
		}
	}
	if best == "" {
		return "", ErrNoBinaries
	}
	return best, nil
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail returns up to the last n bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
