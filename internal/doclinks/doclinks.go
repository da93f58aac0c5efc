// Package doclinks checks that the documentation points somewhere: every
// relative link of a Markdown file names a file that exists and, with a
// #fragment into Markdown, a heading (or an explicit id) there, by
// GitHub's rules for heading anchors. make lint runs it over README.md and
// docs/*.md (doclinks_test.go); links to other sites are not followed.
package doclinks

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/text"
)

// Problem is a link that leads nowhere.
type Problem struct {
	File   string // relative to the root, as given to Check
	Line   int
	Link   string
	Reason string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Link, p.Reason)
}

var md = goldmark.New(goldmark.WithExtensions(extension.GFM))

// Check reads each of files (paths below root) and returns every relative
// link whose file, or whose #anchor in a Markdown file, does not exist.
func Check(root string, files []string) ([]Problem, error) {
	anchors := map[string]map[string]bool{} // by path below root
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		src, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			return nil, err
		}
		a := Anchors(src)
		anchors[path] = a
		return a, nil
	}
	var problems []Problem
	for _, file := range files {
		src, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		for _, l := range Links(src) {
			bad := func(format string, args ...any) {
				problems = append(problems, Problem{File: file, Line: l.Line, Link: l.Dest, Reason: fmt.Sprintf(format, args...)})
			}
			u, err := url.Parse(l.Dest)
			if err != nil {
				bad("does not parse: %v", err)
				continue
			}
			if u.Scheme != "" || u.Host != "" {
				continue // another site's
			}
			target := file
			if u.Path != "" {
				target = filepath.ToSlash(filepath.Join(filepath.Dir(file), u.Path))
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					bad("no such file %s", target)
					continue
				}
			}
			if u.Fragment == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			a, err := anchorsOf(target)
			if err != nil {
				return nil, err
			}
			if !a[u.Fragment] {
				bad("%s has no heading with the anchor #%s", target, u.Fragment)
			}
		}
	}
	return problems, nil
}

// Link is one link of a Markdown file.
type Link struct {
	Dest string
	Line int
}

// Links returns the links and images of the Markdown src (not those in
// code), with their line.
func Links(src []byte) []Link {
	var out []Link
	doc := md.Parser().Parse(text.NewReader(src))
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		var dest []byte
		switch n := n.(type) {
		case *ast.Link:
			dest = n.Destination
		case *ast.Image:
			dest = n.Destination
		default:
			return ast.WalkContinue, nil
		}
		out = append(out, Link{Dest: string(dest), Line: lineOf(src, n)})
		return ast.WalkContinue, nil
	})
	return out
}

// lineOf is the line of the first text inside n (1 when it has none).
func lineOf(src []byte, n ast.Node) int {
	line := 1
	_ = ast.Walk(n, func(c ast.Node, entering bool) (ast.WalkStatus, error) {
		if t, ok := c.(*ast.Text); ok && entering {
			line = 1 + bytes.Count(src[:t.Segment.Start], []byte("\n"))
			return ast.WalkStop, nil
		}
		return ast.WalkContinue, nil
	})
	return line
}

// htmlID is an explicit anchor in raw HTML (<a id="x">, <a name="x">).
var htmlID = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// Anchors returns the anchors GitHub gives the headings of the Markdown
// src (Slug, with -1, -2, … for a repeated one), and the explicit ids of
// its raw HTML anchors.
func Anchors(src []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	doc := md.Parser().Parse(text.NewReader(src))
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		h, ok := n.(*ast.Heading)
		if !ok || !entering {
			return ast.WalkContinue, nil
		}
		slug := Slug(headingText(src, h))
		if k := seen[slug]; k > 0 {
			out[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
		return ast.WalkSkipChildren, nil
	})
	for _, m := range htmlID.FindAllSubmatch(src, -1) {
		out[string(m[1])] = true
	}
	return out
}

// headingText is the text of a heading as GitHub reads it for the anchor:
// the words, code spans' contents and links' texts, without markup.
func headingText(src []byte, h *ast.Heading) string {
	var b strings.Builder
	_ = ast.Walk(h, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Text:
			b.Write(n.Segment.Value(src))
			if n.SoftLineBreak() {
				b.WriteByte(' ')
			}
		case *ast.String:
			b.Write(n.Value)
		case *ast.RawHTML:
			return ast.WalkSkipChildren, nil
		}
		return ast.WalkContinue, nil
	})
	return b.String()
}

// Slug is GitHub's anchor of a heading: lower-cased, every character but
// letters, digits, spaces, '-' and '_' dropped, each space a '-'.
func Slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
