package consumers_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Routers, sweepers and subscriptions must all stop when Run returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
