package api_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/posthorn/posthorn/api"
	"github.com/posthorn/posthorn/configs"
)

// A token configured as its SHA-256 accepts the token, and neither the hash
// itself nor another token gets in.
func TestTokenGivenAsSHA256(t *testing.T) {
	t.Parallel()
	const token = "a-long-enough-secret-token"
	sum := sha256.Sum256([]byte(token))
	hashed := api.TokenHashPrefix + hex.EncodeToString(sum[:])
	e := newEnv(t, hashed, tokenB)
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"Bearer " + token, http.StatusNotFound}, // authenticated; the account does not exist
		{"Bearer " + tokenB, http.StatusNotFound},
		{"Bearer " + hashed, http.StatusUnauthorized},
		{"Bearer " + hex.EncodeToString(sum[:]), http.StatusUnauthorized},
		{"Bearer " + token + "x", http.StatusUnauthorized},
	} {
		if r := e.do(t, request{method: http.MethodGet, path: "/v1/accounts/acc-x", auth: tc.auth}); r.status != tc.want {
			t.Errorf("%.30q: %d, want %d", tc.auth, r.status, tc.want)
		}
	}
	if strings.Contains(e.logs.String(), token) || strings.Contains(e.logs.String(), hex.EncodeToString(sum[:])) {
		t.Fatalf("a token reached the log: %s", e.logs.String())
	}
	for _, bad := range []string{api.TokenHashPrefix + "abc", api.TokenHashPrefix + strings.Repeat("z", 64)} {
		if _, err := api.New(api.Config{Tokens: []string{bad}, Logger: slog.New(slog.DiscardHandler)}, nopStore{}); err == nil {
			t.Errorf("api.New accepted the malformed hash %q", bad)
		}
	}
}

type nopStore struct{ api.Store }

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key as
// PEM files and returns their paths and the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "posthorn test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

// The API serves HTTPS with api.tls.cert_file/key_file: a client that
// trusts the certificate posts and reads; one that does not is refused by
// its own TLS check, and plain HTTP gets no API answer.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, cert := selfSigned(t)
	tlsCfg, err := configs.APITLS{CertFile: certFile, KeyFile: keyFile}.Load()
	if err != nil {
		t.Fatal(err)
	}
	ln, cancel, done := serve(t, api.Config{Tokens: []string{tokenA}, TLS: tlsCfg, Logger: slog.New(slog.DiscardHandler)})
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	base := "https://" + ln.Addr().String()

	roots := x509.NewCertPool()
	roots.AddCert(cert)
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	defer trusting.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/postings", strings.NewReader(
		`{"entries":[{"account":"acc-a","direction":"debit","amount":"5","currency":"EUR"},{"account":"acc-b","direction":"credit","amount":"5","currency":"EUR"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "tls-1")
	req.Header.Set("Authorization", "Bearer "+tokenA)
	res, err := trusting.Do(req)
	if err != nil {
		t.Fatalf("post over TLS: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusCreated || res.TLS == nil {
		t.Fatalf("post over TLS: %d %s (tls %v)", res.StatusCode, body, res.TLS != nil)
	}

	// Control: a client without the certificate in its roots refuses it.
	plainRoots := &http.Client{Transport: &http.Transport{}}
	defer plainRoots.CloseIdleConnections()
	_, err = plainRoots.Get(base + "/healthz")
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("untrusting client: %v, want an unknown-authority error", err)
	}
	// Plain HTTP to the TLS port gets no API response.
	plain := &http.Client{Transport: &http.Transport{}}
	defer plain.CloseIdleConnections()
	if res, err := plain.Get("http://" + ln.Addr().String() + "/healthz"); err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Fatalf("plain HTTP served: %d %s", res.StatusCode, b)
		}
	}
}
