package loadgen

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// maxMixWeight bounds one weight so the total cannot overflow an int.
const maxMixWeight = 1_000_000

// mixEntry is one target of a load mix and its relative weight; a plain
// value.
type mixEntry struct {
	Target string
	Weight int
}

// Mix picks a target for each load request in proportion to the weights.
// It is read-only after ParseMix, so it is safe for concurrent use; the
// random numbers come from each caller's own source.
type Mix struct {
	entries []mixEntry
	cum     []int // cum[i] is the sum of the weights of entries[0..i]
}

// ParseMix parses a mix such as "CORE=70,CLAIM=30". Target names are
// upper-cased (the hub's canonical form); a name without "=WEIGHT" weighs 1;
// a weight of 0 keeps the target in the report but never picks it.
func ParseMix(s string) (Mix, error) {
	var m Mix
	seen := make(map[string]bool)
	total := 0
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return Mix{}, fmt.Errorf("mix %q: empty item", s)
		}
		name, weight, hasWeight := strings.Cut(item, "=")
		name = strings.ToUpper(strings.TrimSpace(name))
		if !ValidTarget(name) {
			return Mix{}, fmt.Errorf("mix %q: bad target name %q", s, name)
		}
		if seen[name] {
			return Mix{}, fmt.Errorf("mix %q: target %s given twice", s, name)
		}
		seen[name] = true
		w := 1
		if hasWeight {
			var err error
			w, err = strconv.Atoi(strings.TrimSpace(weight))
			if err != nil || w < 0 || w > maxMixWeight {
				return Mix{}, fmt.Errorf("mix %q: weight of %s must be an integer from 0 to %d", s, name, maxMixWeight)
			}
		}
		total += w
		m.entries = append(m.entries, mixEntry{Target: name, Weight: w})
		m.cum = append(m.cum, total)
	}
	if total == 0 {
		return Mix{}, errors.New("mix " + strconv.Quote(s) + ": weights add up to 0")
	}
	return m, nil
}

// total returns the sum of the weights; pick takes a number below it.
func (m Mix) total() int { return m.cum[len(m.cum)-1] }

// pick returns the index of the target that the uniform random number r,
// 0 <= r < m.total(), falls on. A linear scan beats a binary search for the
// handful of targets a hub has.
func (m Mix) pick(r int) int {
	for i, c := range m.cum {
		if r < c {
			return i
		}
	}
	return len(m.cum) - 1
}

// index returns the position of the entry for target, or -1 when the mix
// has none.
func (m Mix) index(target string) int {
	for i, e := range m.entries {
		if e.Target == target {
			return i
		}
	}
	return -1
}

// String returns the mix in the form ParseMix reads.
func (m Mix) String() string {
	parts := make([]string, len(m.entries))
	for i, e := range m.entries {
		parts[i] = e.Target + "=" + strconv.Itoa(e.Weight)
	}
	return strings.Join(parts, ",")
}
