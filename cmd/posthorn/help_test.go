package main

import (
	"regexp"
	"strings"
	"testing"
)

// flagTypes are the type names pflag prints after a typed flag's name.
var flagTypes = map[string]bool{"string": true, "int": true, "int64": true, "float": true, "duration": true,
	"strings": true, "stringArray": true, "stringToString": true}

// flagColumn is the part of a help line before the usage text: the flag's
// name, and its type unless it is a bool.
var flagColumn = regexp.MustCompile(`^\s+(?:-\w, )?(--\S.*?)(?:\s{2,}|$)`)

// badFlagLines returns the flag lines of help whose type column is not a
// type: pflag takes a back-quoted word of the usage for the type, which
// once made a line read "--bootstrap-topic posthorn replay --topic".
func badFlagLines(help string) []string {
	var bad []string
	for _, line := range strings.Split(help, "\n") {
		m := flagColumn.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		switch f := strings.Fields(m[1]); len(f) {
		case 1:
		case 2:
			if !flagTypes[f[1]] {
				bad = append(bad, line)
			}
		default:
			bad = append(bad, line)
		}
	}
	return bad
}

// Every command and command group answers --help and `help NAME` on stdout
// with exit 0: what it does, its flags with their types, and an example.
func TestHelpWalksEveryCommand(t *testing.T) {
	t.Parallel()
	groups := map[string]bool{}
	for name := range commands {
		if first, _, ok := strings.Cut(name, " "); ok {
			groups[first] = true
		}
	}
	var names []string
	for name := range commands {
		names = append(names, name)
	}
	for g := range groups {
		if _, isCmd := commands[g]; !isCmd {
			names = append(names, g)
		}
	}
	for _, name := range names {
		h, ok := commandHelp[name]
		if !ok || h.about == "" || !strings.HasPrefix(h.example, "posthorn "+name) && !strings.Contains(h.example, " posthorn "+name) {
			t.Errorf("%s: no help text or no example of it: %+v", name, h)
			continue
		}
		for _, args := range [][]string{append(strings.Fields(name), "--help"), append([]string{"help"}, strings.Fields(name)...)} {
			code, stdout, stderr := runCLI(t, nil, args...)
			if code != 0 || stderr != "" {
				t.Errorf("%v: code %d, stderr %q", args, code, stderr)
				continue
			}
			for _, want := range []string{"Usage: posthorn " + name, firstLine(h.about), "Example:\n  " + h.example} {
				if !strings.Contains(stdout, want) {
					t.Errorf("%v: help lacks %q:\n%s", args, want, stdout)
				}
			}
			if _, isCmd := commands[name]; isCmd && !strings.Contains(stdout, "--config string") {
				t.Errorf("%v: no typed --config flag:\n%s", args, stdout)
			}
			if bad := badFlagLines(stdout); len(bad) > 0 {
				t.Errorf("%v: flag lines without a type: %q", args, bad)
			}
		}
	}
	// Batch sizes are ints, durations durations, with their defaults.
	_, stdout, _ := runCLI(t, nil, "cleanup", "--help")
	for _, want := range []string{"--cleanup.batch_size int", "(default 1000)", "--cleanup.replay_window duration", "(default 168h0m0s)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("cleanup --help lacks %q:\n%s", want, stdout)
		}
	}
	// Negative control: the old back-quoted usage is caught.
	if bad := badFlagLines("      --bootstrap-topic posthorn replay --topic   also read this topic\n      --json   print JSON\n"); len(bad) != 1 {
		t.Errorf("the type check misses a mangled line: %q", bad)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// A bare posthorn lists the commands and exits 2; --version prints the
// version; a group without a command lists its commands and exits 2, and
// an unknown one is named.
func TestBareCommandsAndVersion(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runCLI(t, nil)
	if code != 2 || stdout != "" || !strings.Contains(stderr, "outbox status") {
		t.Errorf("bare posthorn: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, nil, "--help")
	if code != 0 || !strings.Contains(stdout, "outbox status") {
		t.Errorf("posthorn --help: code %d, stdout %q", code, stdout)
	}
	code, stdout, _ = runCLI(t, nil, "--version")
	if code != 0 || !strings.HasPrefix(stdout, "posthorn ") {
		t.Errorf("--version: code %d, stdout %q", code, stdout)
	}
	code, _, stderr = runCLI(t, nil, "outbox")
	if code != 2 || !strings.Contains(stderr, "outbox resend") {
		t.Errorf("posthorn outbox: code %d, stderr %q", code, stderr)
	}
	code, _, stderr = runCLI(t, nil, "outbox", "frob")
	if code != 2 || !strings.Contains(stderr, `unknown command "outbox frob"`) {
		t.Errorf("posthorn outbox frob: code %d, stderr %q", code, stderr)
	}
}

// A misspelt key flag is refused with the key it probably meant.
func TestMisspeltKeyFlagSuggestsTheKey(t *testing.T) {
	t.Parallel()
	code, _, stderr := runCLI(t, nil, "config", "print", "--relay.batchsize", "3")
	if code != 1 || !strings.Contains(stderr, "--relay.batchsize") || !strings.Contains(stderr, "did you mean --relay.batch_size") {
		t.Fatalf("code %d, stderr %q", code, stderr)
	}
	code, stdout, stderr := runCLI(t, nil, "config", "print", "--relay.batch_size", "3")
	if code != 0 || !strings.Contains(stdout, "batch_size: 3") {
		t.Fatalf("the right spelling: code %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
