package console

import "net/http"

// UnframedHandler is Handler as it was before it refused framing: the
// negative control of the framing test.
func (c *Console) UnframedHandler() http.Handler {
	return http.NewCrossOriginProtection().Handler(c.mux)
}
