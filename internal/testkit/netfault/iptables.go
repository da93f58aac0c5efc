package netfault

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// iptables runs iptables with args, waiting for the xtables lock, and
// tries again a few times when another writer's transaction raced it (the
// nf_tables backend answers EBUSY then).
func iptables(args ...string) error {
	_, err := iptablesOut(args...)
	return err
}

func iptablesOut(args ...string) (string, error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("iptables", append([]string{"-w", "5"}, args...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err = cmd.Run(); err == nil {
			return stdout.String(), nil
		}
		msg := strings.TrimSpace(stderr.String())
		err = &iptablesError{args: args, msg: msg, err: err}
		if !strings.Contains(msg, "Resource temporarily unavailable") && !strings.Contains(msg, "Device or resource busy") {
			return "", err
		}
		time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond) // another writer's transaction; not a test's synchronisation
	}
	return "", err
}

type iptablesError struct {
	args []string
	msg  string
	err  error
}

func (e *iptablesError) Error() string {
	return fmt.Sprintf("iptables %s: %v: %s", strings.Join(e.args, " "), e.err, e.msg)
}

func (e *iptablesError) Unwrap() error { return e.err }

// isMissing reports whether err says the rule or chain is not there (it
// was removed already).
func isMissing(err error) bool {
	e, ok := err.(*iptablesError)
	if !ok {
		return false
	}
	for _, s := range []string{"No chain/target/match by that name", "does a matching rule exist", "Bad rule", "doesn't exist", "No such file or directory"} {
		if strings.Contains(e.msg, s) {
			return true
		}
	}
	return false
}
