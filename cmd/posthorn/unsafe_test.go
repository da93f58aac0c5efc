package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The --unsafe-* negative-control flags are not in the production binary:
// neither in --help nor accepted; a build with -tags posthorn_unsafe (the
// fault suite's, faultkit.Build) still has them.
func TestUnsafeFlagsOnlyInTheTestBuild(t *testing.T) {
	if unsafeFlags {
		t.Skip("this test binary was built with -tags posthorn_unsafe")
	}
	for _, c := range []struct{ cmd, flag string }{{"relay", "--unsafe-mark-before-ack"}, {"relay", "--unsafe-skip-positions"}, {"consume", "--unsafe-no-inbox"}} {
		code, stdout, stderr := runCLI(t, nil, c.cmd, "--help")
		if code != 0 || strings.Contains(stdout+stderr, "unsafe") {
			t.Errorf("%s --help: code %d, mentions unsafe: %s%s", c.cmd, code, stdout, stderr)
		}
		code, _, stderr = runCLI(t, nil, c.cmd, c.flag)
		if code == 0 || !strings.Contains(stderr, "unknown flag: "+c.flag) {
			t.Errorf("production %s %s: code %d, %s; want it refused as an unknown flag", c.cmd, c.flag, code, stderr)
		}
	}
	tagged := filepath.Join(t.TempDir(), "posthorn-unsafe")
	if out, err := exec.Command("go", "build", "-tags", "posthorn_unsafe", "-o", tagged, ".").CombinedOutput(); err != nil {
		t.Fatalf("tagged build: %v\n%s", err, out)
	}
	for _, c := range []struct{ cmd, flag, want string }{
		{"relay", "--unsafe-mark-before-ack", "database.url"},
		{"relay", "--unsafe-skip-positions", "database.url"},
		{"consume", "--unsafe-no-inbox", "consumer.database.url"},
	} {
		cmd := exec.Command(tagged, c.cmd, c.flag)
		cmd.Env = []string{"HOME=" + t.TempDir()}
		out, _ := cmd.CombinedOutput()
		if strings.Contains(string(out), "unknown flag") || !strings.Contains(string(out), c.want) {
			t.Errorf("tagged %s %s: %s; want the flag accepted (then the missing %s refused)", c.cmd, c.flag, out, c.want)
		}
	}
}
