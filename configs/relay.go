package configs

import (
	"errors"

	"github.com/posthorn/posthorn/relay"
)

// relay.* is decoded straight into relay.Settings: its keys, defaults
// (relay.Defaults) and checks (relay.Settings.Validate) live with the relay
// that reads them, once for both modes. This file only reports the relay's
// check under the key's full name.

// validateRelay returns relay.Settings.Validate's error as a *FieldError
// naming relay.<key>.
func validateRelay(s relay.Settings) error {
	err := s.Validate()
	if fe := (*relay.FieldError)(nil); errors.As(err, &fe) {
		return fieldErr("relay."+fe.Key, "%s", fe.Msg)
	}
	return err
}
