// Package units formats quantities for people: the CLI's status output and
// the operator console show WAL sizes the same way.
package units

import "fmt"

// ByteSize is n bytes in B, KiB, MiB or GiB with one decimal.
func ByteSize(n int64) string {
	switch {
	case n >= 1<<30 || n <= -1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20 || n <= -1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 || n <= -1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
