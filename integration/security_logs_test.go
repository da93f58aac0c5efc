package integration

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/posthorn/posthorn/adapters/postgres"
	"github.com/posthorn/posthorn/consumers/auditlog"
	"github.com/posthorn/posthorn/consumers/projection"
	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/internal/testkit/faultkit"
	"github.com/posthorn/posthorn/internal/testkit/roletest"
	"github.com/posthorn/posthorn/internal/testkit/wait"
)

// secretForms are the shapes a secret could take in a log line: as is,
// JSON-escaped, URL-encoded, base64. A scanner that missed an encoded form
// would pass a log that leaks.
func secretForms(s string) []string {
	j, _ := json.Marshal(s)
	return []string{s, strings.Trim(string(j), `"`), url.QueryEscape(s), url.PathEscape(s), base64.StdEncoding.EncodeToString([]byte(s))}
}

// scanForSecrets returns "file: secret name" for every secret found in any
// file under dir.
func scanForSecrets(t *testing.T, dir string, secrets map[string]string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for name, s := range secrets {
			for _, f := range secretForms(s) {
				if strings.Contains(string(b), f) {
					found = append(found, filepath.Base(path)+": "+name)
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func randomSecret(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// TestSecurityNoSecretInAnyLog runs the whole system as users run it — the
// posthorn binary as child processes: api, relay and consume, each under
// its own database LOGIN role with a password, the API with bearer tokens,
// Kafka (kfake over TLS) with a SCRAM-SHA-512 password read from a file —
// at debug level, posts through the API (including refused requests),
// waits until both consumers applied every event, prints the configuration,
// runs a command that fails to connect, stops everything with SIGTERM, and
// scans every byte the processes wrote for every secret in every encoding.
// Control: a line written by slog with a secret in it is found by the same
// scan. The local server trusts 127.0.0.1, so the database passwords are
// not checked, but they are in every DSN and must still never be logged.
//
// It also shows the superuser warning: the same api under the superuser
// DSN warns at start, under posthorn_api it does not.
func TestSecurityNoSecretInAnyLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logDir := t.TempDir()
	bin := posthornBin(t)

	secrets := map[string]string{
		"api db password":      randomSecret("dbapi"),
		"relay db password":    randomSecret("dbrelay"),
		"consumer db password": randomSecret("dbcons"),
		"api token":            randomSecret("tok"),
		"second api token":     randomSecret("tok2"),
		"kafka sasl password":  randomSecret("sasl"),
	}

	ledgerURL, _ := roletest.Ledger(t)
	consumerURL, consumerOwner := roletest.Consumer(t)
	apiURL := roletest.Login(t, ledgerURL, postgres.RoleAPI, secrets["api db password"])
	relayURL := roletest.Login(t, ledgerURL, postgres.RoleRelay, secrets["relay db password"])
	consURL := roletest.Consumers(t, consumerURL, secrets["consumer db password"], projection.Name, auditlog.Name)

	// Kafka over TLS with SCRAM: httptest's certificate for 127.0.0.1.
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	serverCert := ts.TLS.Certificates[0]
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	ts.Close()
	secretsDir := t.TempDir() // outside logDir: the files hold the secrets
	caFile := filepath.Join(secretsDir, "ca.pem")
	saslFile := filepath.Join(secretsDir, "sasl-password")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(saslFile, []byte(secrets["kafka sasl password"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, core.TopicEvents, "commands.payouts"),
		kfake.AllowAutoTopicCreation(), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "posthorn", secrets["kafka sasl password"]),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)

	common := []string{
		"POSTHORN_LOG__LEVEL=debug",
		"POSTHORN_SINK__KIND=kafka",
		"POSTHORN_SINK__KAFKA__BROKERS=" + strings.Join(cluster.ListenAddrs(), ","),
		"POSTHORN_SINK__KAFKA__TLS__CA_FILE=" + caFile,
		"POSTHORN_SINK__KAFKA__SASL__MECHANISM=SCRAM-SHA-512",
		"POSTHORN_SINK__KAFKA__SASL__USERNAME=posthorn",
		"POSTHORN_SINK__KAFKA__SASL__PASSWORD=file:" + saslFile,
		"POSTHORN_API__TOKENS=" + secrets["api token"] + "," + secrets["second api token"],
	}
	apiAddr, relayMetrics, consMetrics := freeAddr(t), freeAddr(t), freeAddr(t)
	procs := []*faultkit.Proc{
		faultkit.NewProc(faultkit.ProcConfig{Name: "api", Bin: bin, Args: []string{"api"}, LogDir: logDir,
			Env:   append([]string{"POSTHORN_DATABASE__URL=" + apiURL, "POSTHORN_API__LISTEN=" + apiAddr}, common...),
			Ready: faultkit.HTTPReady("http://" + apiAddr + "/readyz")}),
		faultkit.NewProc(faultkit.ProcConfig{Name: "relay", Bin: bin, Args: []string{"relay"}, LogDir: logDir,
			Env:   append([]string{"POSTHORN_DATABASE__URL=" + relayURL, "POSTHORN_METRICS__LISTEN=" + relayMetrics}, common...),
			Ready: faultkit.HTTPReady("http://" + relayMetrics + "/readyz")}),
		faultkit.NewProc(faultkit.ProcConfig{Name: "consume", Bin: bin, Args: []string{"consume"}, LogDir: logDir,
			Env:   append([]string{"POSTHORN_CONSUMER__DATABASE__URL=" + consURL, "POSTHORN_METRICS__LISTEN=" + consMetrics}, common...),
			Ready: faultkit.HTTPReady("http://" + consMetrics + "/readyz")}),
	}
	for _, p := range procs {
		t.Cleanup(p.Close)
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range procs {
				b, _ := os.ReadFile(p.LogPath())
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("%s, its log's last lines:\n%s", p.LogPath(), strings.Join(lines[max(0, len(lines)-12):], "\n"))
			}
		}
	})

	// Traffic: accepted postings with both tokens, a wrong token, a bad body.
	const postings = 20
	post := func(token, key, body string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+apiAddr+"/v1/postings", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for i := range postings {
		token := secrets["api token"]
		if i%2 == 1 {
			token = secrets["second api token"]
		}
		body := fmt.Sprintf(`{"entries":[{"account":"acc-%d","direction":"debit","amount":"%d","currency":"EUR"},
{"account":"acc-%d","direction":"credit","amount":"%d","currency":"EUR"}],"metadata":{"reference":"r-%d"}}`, i%4, 100+i, 4+i%3, 100+i, i)
		if code := post(token, fmt.Sprintf("logs-%d", i), body); code != http.StatusCreated {
			t.Fatalf("posting %d: %d", i, code)
		}
	}
	if code := post(secrets["api token"]+"x", "logs-wrong", `{}`); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", code)
	}
	if code := post(secrets["api token"], "logs-bad", `{"entries":[`); code != http.StatusBadRequest {
		t.Fatalf("bad body: %d", code)
	}
	wait.For(t, 90*time.Second, "both consumers applied every event", func() bool {
		var n int
		if err := consumerOwner.QueryRow(ctx, `SELECT count(*) FROM consumer_inbox WHERE disposition = 'applied'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2*2*postings
	})

	// One-shot commands with every secret set: config print, and a command
	// whose connection fails (an error path).
	oneShot := func(name string, env []string, args ...string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(append(os.Environ(), common...), env...)
		out, _ := cmd.CombinedOutput()
		if err := os.WriteFile(filepath.Join(logDir, name+".log"), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	oneShot("config-print", []string{"POSTHORN_DATABASE__URL=" + apiURL, "POSTHORN_CONSUMER__DATABASE__URL=" + consURL}, "config", "print")
	noDB, _ := url.Parse(relayURL)
	noDB.Path = "/posthorn_no_such_database"
	oneShot("outbox-status-fails", []string{"POSTHORN_DATABASE__URL=" + noDB.String()}, "outbox", "status")
	if b, _ := os.ReadFile(filepath.Join(logDir, "config-print.log")); !strings.Contains(string(b), "REDACTED") {
		t.Fatalf("config print shows no redaction:\n%s", b)
	}

	for _, p := range procs {
		p.Term(30 * time.Second)
		if tail := faultkit.Tail(p.LogPath(), 1); !strings.Contains(tail, "exit status 0") {
			t.Errorf("%s did not stop cleanly on SIGTERM: %s", p.Name, tail)
		}
	}
	if b, _ := os.ReadFile(procs[0].LogPath()); strings.Contains(string(b), "MORE PRIVILEGES THAN") {
		t.Errorf("the api under posthorn_api warns about its privileges:\n%s", b)
	}

	// The superuser warning: the same api under the test server's superuser DSN.
	suAddr := freeAddr(t)
	su := faultkit.NewProc(faultkit.ProcConfig{Name: "api-superuser", Bin: bin, Args: []string{"api"}, LogDir: logDir,
		Env:   append([]string{"POSTHORN_DATABASE__URL=" + ledgerURL, "POSTHORN_API__LISTEN=" + suAddr}, common...),
		Ready: faultkit.HTTPReady("http://" + suAddr + "/readyz")})
	t.Cleanup(su.Close)
	if err := su.Start(ctx); err != nil {
		t.Fatal(err)
	}
	su.Term(30 * time.Second)
	if b, _ := os.ReadFile(su.LogPath()); !strings.Contains(string(b), "MORE PRIVILEGES THAN") || !strings.Contains(string(b), `"superuser":true`) {
		t.Errorf("no superuser warning at start of the api under a superuser DSN:\n%s", b)
	}

	var lines int
	entries, _ := os.ReadDir(logDir)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(logDir, e.Name()))
		lines += strings.Count(string(b), "\n")
	}
	if lines < 20 {
		t.Fatalf("only %d log lines captured; the scan would prove little", lines)
	}
	if found := scanForSecrets(t, logDir, secrets); len(found) != 0 {
		t.Fatalf("secrets in the logs: %v (logs in %s)", found, logDir)
	}
	t.Logf("%d log lines of %d files scanned, no secret in any of %d encodings", lines, len(entries), len(secretForms("x")))

	// Control: a secret logged the way slog would log it is found.
	controlDir := t.TempDir()
	f, err := os.Create(filepath.Join(controlDir, "leaky.log"))
	if err != nil {
		t.Fatal(err)
	}
	slog.New(slog.NewJSONHandler(f, nil)).Info("connecting", "dsn", relayURL)
	f.Close()
	if found := scanForSecrets(t, controlDir, secrets); len(found) != 1 || !strings.Contains(found[0], "relay db password") {
		t.Fatalf("control: the scan missed a logged DSN with its password: %v", found)
	}
}
