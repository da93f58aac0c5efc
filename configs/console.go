package configs

import (
	"strings"

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
}

func defaultConsole() Console { return Console{Listen: ConsoleListenDefault} }

func (c Console) validate() error {
	if err := validateAddr("console.listen", c.Listen, false); err != nil {
		return err
	}
	if c.Token == "" {
		return nil
	}
	if strings.HasPrefix(c.Token, TokenHashPrefix) {
		if _, err := core.ParseTokens([]string{c.Token}); err != nil {
			return fieldErr("console.token", "starts with %q but is not followed by 64 hex digits (the token's SHA-256)", TokenHashPrefix)
		}
		return nil
	}
	if len(c.Token) < 16 {
		return fieldErr("console.token", "is shorter than 16 characters")
	}
	return nil
}
