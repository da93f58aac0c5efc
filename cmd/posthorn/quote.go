package main

import (
	"strconv"
	"unicode"
)

// printable returns s as it is when every rune of it prints, and quoted
// with Go's escapes (strconv.Quote) otherwise. Every string from the data
// (aggregate IDs, reasons, owners, consumer names) goes through it before
// a text-mode command prints it: whoever can write an aggregate ID must
// not be able to send escape sequences to an operator's terminal, clear
// the screen or forge rows. JSON output escapes them already.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
