package configs

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"

	"github.com/posthorn/posthorn/core"
)

// ConsoleListenDefault is where `posthorn console` listens unless
// console.listen or --listen says otherwise (contract.md).
const ConsoleListenDefault = "127.0.0.1:8090"

// Console configures the operator console (`posthorn console`).
type Console struct {
	Listen string `koanf:"listen"`
	// Token unlocks the console's actions (release, resend, reconcile);
	// empty keeps the console read-only. Like api.tokens it may be the
	// token's SHA-256 as "sha256:<hex>" or "file:/path"; it is a secret
	// (SecretKeys) and never printed.
	Token string `koanf:"token"`
	// Operators maps each operator's name to their own token (same forms
	// as Token): presenting it unlocks the actions and names the operator
	// in the audit log, instead of a name the caller types. Secret.
	Operators map[string]string `koanf:"operators"`
}

func defaultConsole() Console { return Console{Listen: ConsoleListenDefault} }

func (c Console) validate() error {
	if err := validateAddr("console.listen", c.Listen, false); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(c.Operators)) {
		key := "console.operators." + name
		if name == "" || len(name) > 64 || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return fieldErr(fmt.Sprintf("console.operators[%.70q]", name), "the name must be 1 to 64 printable characters")
		}
		if c.Operators[name] == "" {
			return fieldErr(key, "is empty: give the operator a token")
		}
		if err := validateConsoleToken(key, c.Operators[name]); err != nil {
			return err
		}
	}
	if c.Token == "" {
		return nil
	}
	return validateConsoleToken("console.token", c.Token)
}

// validateConsoleToken checks a console token given as the token (at least
// 16 characters) or as its hash.
func validateConsoleToken(key, token string) error {
	if strings.HasPrefix(token, TokenHashPrefix) {
		if _, err := core.ParseTokens([]string{token}); err != nil {
			return fieldErr(key, "starts with %q but is not followed by 64 hex digits (the token's SHA-256)", TokenHashPrefix)
		}
		return nil
	}
	if len(token) < 16 {
		return fieldErr(key, "is shorter than 16 characters")
	}
	return nil
}
