// Package envcheck refuses the environment variables that look like a
// command's settings but name none of them: with kong, a misspelt
// RELAY_TARGET_TIMOUT is not an error, it is silently not read, and the
// command runs on a default its operator meant to change. The variables a
// command knows are read from its kong model, the env tags of every flag
// and argument of every one of its commands, so the check never falls
// behind the flags.
//
// Typical use, in a command's main, after parsing:
//
//	if err := envcheck.Check(parser.Model, "RELAY_", os.Environ()); err != nil {
//		parser.FatalIfErrorf(err)
//	}
package envcheck

import (
	"fmt"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
)

// Check returns an error naming every variable of environ (KEY=VALUE
// pairs, as os.Environ gives them) whose name starts with prefix but is
// no variable of app's flags and arguments, whichever command they belong
// to, each with the nearest variable that is; nil when there is none. The
// error is one line.
func Check(app *kong.Application, prefix string, environ []string) error {
	known := Known(app)
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, prefix) && !slices.Contains(known, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	parts := make([]string, 0, len(unknown))
	for _, name := range slices.Compact(unknown) {
		msg := name + ": no such setting"
		if near := nearest(name, known, prefix); near != "" {
			msg += "; did you mean " + near + "?"
		}
		parts = append(parts, msg)
	}
	return fmt.Errorf("environment: %s", strings.Join(parts, "; "))
}

// Known returns the environment variables of app's flags and arguments,
// every command's, sorted.
func Known(app *kong.Application) []string {
	var known []string
	_ = kong.Visit(app, func(node kong.Visitable, next kong.Next) error {
		if v, ok := node.(*kong.Value); ok && v.Tag != nil {
			known = append(known, v.Tag.Envs...)
		}
		return next(nil)
	})
	slices.Sort(known)
	return slices.Compact(known)
}

// nearest returns the variable of known with the same prefix closest to
// name in edit distance, the first in order of a tie; empty when there is
// none.
func nearest(name string, known []string, prefix string) string {
	best, bestDist := "", -1
	for _, k := range known {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		if d := distance(name, k); bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// distance is the edit distance between a and b: the fewest insertions,
// deletions, substitutions and swaps of two adjacent bytes that turn one
// into the other (the optimal string alignment distance).
func distance(a, b string) int {
	// prev2, prev and cur are three rows of the table.
	prev2 := make([]int, len(b)+1)
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
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
