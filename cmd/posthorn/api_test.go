package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/posthorn/posthorn/internal/testkit/pgtest"
)

// `posthorn api` serves postings on the configured database, says at start
// that authentication is off when no token is set, and exits 0 on SIGTERM.
func TestAPIServesAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	url, _ := pgtest.Ledger(t)
	cmd := cliCommand([]string{"POSTHORN_API__TOKENS="}, "api", "--database.url", url, "--api.listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	startCLI(t, cmd)

	// Read the JSON log until the listening line gives the address.
	var addr string
	authOffLogged := false
	sc := bufio.NewScanner(stderr)
	for addr == "" && sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		msg, _ := rec["msg"].(string)
		if strings.Contains(msg, "AUTHENTICATION IS OFF") && rec["level"] == "WARN" {
			authOffLogged = true
		}
		if msg == "Posting API listening" {
			addr, _ = rec["addr"].(string)
		}
	}
	if addr == "" {
		t.Fatalf("no listening line in the log (%v)", sc.Err())
	}
	go func() { // keep draining so the server never blocks on a full pipe
		for sc.Scan() {
		}
	}()
	if !authOffLogged {
		t.Error("with no tokens the API must log a warning that authentication is off")
	}

	postTransfer(t, addr, "cli-1", nil)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("posthorn api after SIGTERM: %v, want exit 0", err)
	}
}

// postTransfer posts one small transfer to the API at addr under key, with
// the extra request headers, and fails t unless it is created.
func postTransfer(t *testing.T, addr, key string, headers map[string]string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/postings", strings.NewReader(
		`{"entries":[{"account":"a","direction":"debit","amount":"1","currency":"EUR"},{"account":"b","direction":"credit","amount":"1","currency":"EUR"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/postings: %d, want 201", res.StatusCode)
	}
}
