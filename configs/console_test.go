package configs

import (
	"os"
	"path/filepath"
	"testing"
)

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
