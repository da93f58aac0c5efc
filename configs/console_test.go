package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// console.listen defaults to the contract's address; console.token is
// checked like api.tokens, read from a file, and redacted.
func TestConsoleKeys(t *testing.T) {
	t.Parallel()
	cfg := loadEnv(t)
	if cfg.Console.Listen != "127.0.0.1:8090" || cfg.Console.Token != "" {
		t.Fatalf("defaults: %+v", cfg.Console)
	}
	const secret = "console-secret-0123456789"
	for _, tc := range []struct {
		env, wantErr string
	}{
		{"POSTHORN_CONSOLE__LISTEN=nowhere", "config key console.listen"},
		{"POSTHORN_CONSOLE__TOKEN=short", "config key console.token: is shorter than 16"},
		{"POSTHORN_CONSOLE__TOKEN=sha256:abc", "config key console.token: starts with"},
	} {
		_, err := Load("", []string{tc.env}, nil)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: err %v, want %q", tc.env, err, tc.wantErr)
		}
	}
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg = loadEnv(t, "POSTHORN_CONSOLE__TOKEN=file:"+path)
	if cfg.Console.Token != secret {
		t.Fatalf("token from file: %q", cfg.Console.Token)
	}
	if got := cfg.Redacted().Console.Token; got != "REDACTED" {
		t.Fatalf("redacted token: %q", got)
	}
	sum := sha256.Sum256([]byte(secret))
	if _, err := Load("", []string{"POSTHORN_CONSOLE__TOKEN=sha256:" + hex.EncodeToString(sum[:])}, nil); err != nil {
		t.Fatalf("hashed token: %v", err)
	}
}

// console.operators comes from the environment and from a file, its
// tokens may be files, and config print redacts them.
func TestConsoleOperators(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "bob")
	if err := os.WriteFile(secret, []byte("bob-own-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := loadEnv(t, "POSTHORN_CONSOLE__OPERATORS__ALICE=alice-own-token-0123456", "POSTHORN_CONSOLE__OPERATORS__BOB=file:"+secret)
	if got := cfg.Console.Operators; len(got) != 2 || got["alice"] != "alice-own-token-0123456" || got["bob"] != "bob-own-token-0123456789" {
		t.Fatalf("console.operators: %v", got)
	}
	if r := cfg.Redacted().Console.Operators; r["alice"] != redacted || r["bob"] != redacted || cfg.Console.Operators["alice"] == redacted {
		t.Fatalf("redacted %v (the original must keep its tokens)", r)
	}
	refusedNamingKey(t, map[string]string{
		"POSTHORN_CONSOLE__OPERATORS__ALICE=short":    "console.operators.alice",
		"POSTHORN_CONSOLE__OPERATORS__BOB=sha256:abc": "console.operators.bob",
	})
}
