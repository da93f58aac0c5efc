package configs

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

// sections are the configuration's top-level names. An environment
// variable POSTHORN_<SECTION>_… that is not a key is a misspelt key (one
// underscore where two separate the levels) rather than another program's
// variable, and is refused like a variable with "__" that names no key.
func sections() map[string]bool {
	out := make(map[string]bool)
	t := reflect.TypeOf(Config{})
	for i := range t.NumField() {
		out[t.Field(i).Tag.Get("koanf")] = true
	}
	return out
}

// Keys returns every configuration key with its default value, sorted;
// reconcile.consumers, a list of records, is the one key only the file
// can set, and it is left out.
func Keys() []string {
	k := defaultsKoanf()
	var out []string
	for _, key := range k.Keys() {
		if _, isList := k.Get(key).([]any); isList {
			continue
		}
		out = append(out, key)
	}
	sort.Strings(out)
	return out
}

func defaultsKoanf() *koanf.Koanf {
	k := koanf.New(".")
	// The defaults are a struct literal: loading them cannot fail.
	_ = k.Load(structs.Provider(Default(), "koanf"), nil)
	return k
}

// EnvName is the environment variable that sets key.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
}

// AddKeyFlags defines on fs one flag per configuration key (Keys), named
// by the key and typed by its default: --relay.batch_size is an int,
// --relay.poll_interval a duration, --sink.kafka.brokers a comma-separated
// list. Load takes only the flags that were set, above the file and the
// environment. The keys in shown are listed in fs's help; the others are
// hidden there (the help says every key is a flag) but accepted all the
// same. A flag fs already has keeps its own definition.
func AddKeyFlags(fs *pflag.FlagSet, shown ...string) {
	show := make(map[string]bool, len(shown))
	for _, s := range shown {
		show[s] = true
	}
	k := defaultsKoanf()
	for _, key := range Keys() {
		if fs.Lookup(key) != nil {
			continue
		}
		usage := "config key " + key + " (env " + EnvName(key) + ")"
		switch v := k.Get(key).(type) {
		case int:
			fs.Int(key, v, usage)
		case bool:
			fs.Bool(key, v, usage)
		case float64:
			fs.Float64(key, v, usage)
		case time.Duration:
			fs.Duration(key, v, usage)
		case []string:
			fs.StringSlice(key, v, usage+", comma-separated")
		case map[string]string:
			fs.StringToString(key, v, usage+", NAME=VALUE,…")
		default:
			fs.String(key, fmt.Sprint(v), usage)
		}
		if !show[key] {
			_ = fs.MarkHidden(key)
		}
	}
}

// Suggest returns the configuration key closest to the misspelt key
// (relay.batchsize → relay.batch_size), or "" when none is close.
func Suggest(key string) string {
	squash := func(s string) string {
		return strings.NewReplacer("_", "", "-", "", ".", "").Replace(strings.ToLower(s))
	}
	best, bestDist := "", 4 // farther than three edits is no suggestion
	for _, known := range Keys() {
		if squash(known) == squash(key) {
			return known
		}
		if d := editDistance(known, strings.ToLower(key)); d < bestDist {
			best, bestDist = known, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// unknownKeyErr is the error for key, which is not a configuration key,
// found in where (a file, the environment variable …), with the closest
// key as a suggestion.
func unknownKeyErr(key, where string) error {
	msg := "is not a configuration key (" + where + ")"
	if s := Suggest(key); s != "" {
		msg += fmt.Sprintf("; did you mean %s (env %s)?", s, EnvName(s))
	}
	return fieldErr(key, "%s", msg)
}

// InsecureKeys returns the keys of c that turn a protection off and are
// set (every …insecure… key that is true, such as
// sink.nats.tls.insecure_skip_verify), sorted, so a command can warn about
// each at start.
func (c Config) InsecureKeys() []string {
	k := koanf.New(".")
	_ = k.Load(structs.Provider(c, "koanf"), nil) // a struct: cannot fail
	var out []string
	for _, key := range k.Keys() {
		if on, ok := k.Get(key).(bool); ok && on && strings.Contains(key, "insecure") {
			out = append(out, key)
		}
	}
	sort.Strings(out)
	return out
}
