package replay

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/settingsfile"
)

// Settings is one set of breaker settings to replay a log with, in the
// hub's own terms: the settings the flags give every target, and the
// targets with settings of their own, as relay.Config takes them. It is a
// plain value; Run copies what it needs.
type Settings struct {
	// Name labels the set in reports.
	Name string
	// Defaults are the settings of every target that Targets gives no
	// settings of its own: the flags', as relay.Config's TargetSettings.
	Defaults relay.TargetSettings
	// Targets are targets with settings of their own or a fallback, as
	// settingsfile.Load returns them. Their URLs are not used: the replay
	// calls no target.
	Targets []relay.Target
	// Seed seeds the random source of the reset jitter, when it is on.
	Seed uint64
}

// target returns the settings of the target named name (canonical), every
// default filled in, and the canonical name of its fallback ("" for none).
func (s *Settings) target(name string) (relay.TargetSettings, string) {
	for _, t := range s.Targets {
		if strings.EqualFold(t.Name, name) {
			ts := s.Defaults
			if t.Settings != nil {
				ts = *t.Settings
			}
			return ts.WithDefaults(), strings.ToUpper(t.Fallback)
		}
	}
	return s.Defaults.WithDefaults(), ""
}

// Describe returns the settings target name runs with as the settings
// file's keys, the limit and timeouts that the breaker uses and then the
// policies that are on: "fail_threshold=5 reset_timeout=10s ...".
func (s *Settings) Describe(name string) string {
	ts, fallback := s.target(name)
	p := ts.Policy.Effective()
	var b strings.Builder
	fmt.Fprintf(&b, "fail_threshold=%d reset_timeout=%s target_timeout=%s failure_codes=%s",
		p.FailThreshold, p.ResetTimeout, ts.TargetTimeout, strings.Join(ts.FailureCodes, ","))
	if p.FailureRate > 0 {
		fmt.Fprintf(&b, " failure_rate=%v window=%s min_samples=%d", p.FailureRate, p.Window, p.MinSamples)
	}
	if p.SlowCall > 0 {
		fmt.Fprintf(&b, " slow_call=%s", p.SlowCall)
	}
	if p.MaxResetTimeout > 0 {
		fmt.Fprintf(&b, " max_reset_timeout=%s", p.MaxResetTimeout)
	}
	if p.ResetJitter > 0 {
		fmt.Fprintf(&b, " reset_jitter=%v", p.ResetJitter)
	}
	if ts.ProbePayload != "" {
		expect := ts.ProbeExpect
		if len(expect) == 0 {
			expect = []string{relay.DefaultProbeExpect}
		}
		fmt.Fprintf(&b, " probe_payload=%q probe_expect=%s", ts.ProbePayload, strings.Join(expect, ","))
	}
	if p.ProbeSuccesses > 1 {
		fmt.Fprintf(&b, " probe_successes=%d", p.ProbeSuccesses)
	}
	if p.ProbeInterval > 0 {
		fmt.Fprintf(&b, " probe_interval=%s", p.ProbeInterval)
	}
	if fallback != "" {
		fmt.Fprintf(&b, " fallback=%s", fallback)
	}
	return b.String()
}

// placeholderURL stands for the URL of a target whose settings are read
// for a replay, which calls no target.
const placeholderURL = "http://127.0.0.1"

// LoadFile reads the hub's per-target settings file at path with
// settingsfile.Load, on top of defaults (the flags' settings), and returns
// its targets as Settings.Targets wants them. The hub reads the file
// together with its --target list, which a replay does not have: the
// targets of that list are the file's tables that give no url, and the
// fallbacks the file names without a table, so they are taken as its
// base. Every value then means what it means to the hub, and every
// mistake the hub refuses is refused with the same message.
func LoadFile(path string, defaults relay.TargetSettings) ([]relay.Target, error) {
	var tables map[string]any
	md, err := toml.DecodeFile(path, &tables)
	if err != nil {
		// settingsfile says what is wrong in the hub's words.
		return settingsfile.Load(path, defaults, nil)
	}
	var base []relay.Target
	known := map[string]bool{}
	add := func(name string) {
		if !known[strings.ToUpper(name)] {
			known[strings.ToUpper(name)] = true
			base = append(base, relay.Target{Name: name, URL: placeholderURL})
		}
	}
	for _, key := range md.Keys() {
		if t, ok := tables[key[0]].(map[string]any); ok && len(key) == 1 && t["url"] == nil {
			add(key[0])
		}
	}
	// A fallback may be a target of the --target list that the file
	// gives no table.
	for _, key := range md.Keys() {
		if t, ok := tables[key[0]].(map[string]any); ok && len(key) == 1 {
			if fb, ok := t["fallback"].(string); ok && tables[fb] == nil && !known[strings.ToUpper(fb)] {
				add(fb)
			}
		}
	}
	return settingsfile.Load(path, defaults, base)
}

// Override returns s, named name, with overrides applied, each "KEY=VALUE"
// or "TARGET.KEY=VALUE": KEY is a key of the settings file (fail_threshold,
// reset_timeout, slow_call, ...), VALUE is written as on the hub's command
// line (5, 10s, 0.5, E500,E901,E902), and the value is set for every
// target, or for TARGET only. A target's own override wins over one for
// every target. Each value is read by settingsfile, as if the targets'
// tables of the hub's file held it, so it means what it means there and is
// refused for what the hub would refuse; errors name source, where the
// overrides came from.
func (s Settings) Override(name, source string, overrides []string) (Settings, error) {
	out := Settings{Name: name, Seed: s.Seed}
	var every []string
	own := map[string][]string{}
	var order []string // targets with overrides of their own, in order given
	for _, o := range overrides {
		key, value, ok := strings.Cut(o, "=")
		if !ok || strings.TrimSpace(key) == "" {
			return out, fmt.Errorf("%s %q: want KEY=VALUE or TARGET.KEY=VALUE", source, o)
		}
		key = strings.TrimSpace(key)
		target, key, one := strings.Cut(key, ".")
		if !one {
			target, key = "", target
		}
		target = strings.ToUpper(target)
		switch key {
		case "url":
			return out, fmt.Errorf("%s %q: a replay calls no target, so a url means nothing to it", source, o)
		case "fallback":
			if target == "" {
				return out, fmt.Errorf("%s %q: give a fallback per target, as TARGET.fallback=NAME", source, o)
			}
		}
		line := strconv.Quote(key) + " = " + tomlValue(key, strings.TrimSpace(value))
		if target == "" {
			every = append(every, line)
			continue
		}
		if _, seen := own[target]; !seen {
			order = append(order, target)
		}
		own[target] = append(own[target], line)
	}

	all := slices.Clone(s.Targets)
	for _, name := range order {
		if !slices.ContainsFunc(all, func(t relay.Target) bool { return strings.EqualFold(t.Name, name) }) {
			all = append(all, relay.Target{Name: name})
		}
	}
	var err error
	if out.Defaults, _, err = overrideOne(source, defaultsTable, s.Defaults, "", every, all); err != nil {
		return out, err
	}
	for _, t := range all {
		name := strings.ToUpper(t.Name)
		start, fallback := s.target(name)
		ts, fb, err := overrideOne(source, name, start, fallback, keysFor(every, own[name]), all)
		if err != nil {
			return out, err
		}
		out.Targets = append(out.Targets, relay.Target{Name: name, URL: placeholderURL, Settings: &ts, Fallback: fb})
	}
	return out, nil
}

// defaultsTable is the table under which Override reads the overrides for
// every target; errors leave its name out.
const defaultsTable = "EVERY_TARGET"

// keysFor returns the lines of every, less the keys that own sets, then
// own's: a target's own value of a key wins.
func keysFor(every, own []string) []string {
	key := func(line string) string { k, _, _ := strings.Cut(line, " = "); return k }
	var out []string
	for _, e := range every {
		if !slices.ContainsFunc(own, func(o string) bool { return key(o) == key(e) }) {
			out = append(out, e)
		}
	}
	return append(out, own...)
}

// overrideOne reads lines as the table of target name in a settings file
// named source whose targets are all, name starting from settings start
// and fallback, and returns its settings and fallback.
func overrideOne(source, name string, start relay.TargetSettings, fallback string, lines []string, all []relay.Target) (relay.TargetSettings, string, error) {
	if len(lines) == 0 {
		return start, fallback, nil
	}
	base := []relay.Target{{Name: name, URL: placeholderURL, Fallback: fallback}}
	for _, t := range all {
		if !strings.EqualFold(t.Name, name) {
			base = append(base, relay.Target{Name: t.Name, URL: placeholderURL, Fallback: t.Fallback})
		}
	}
	data := "[" + strconv.Quote(name) + "]\n" + strings.Join(lines, "\n") + "\n"
	targets, err := settingsfile.Parse(source, data, start, base)
	if err != nil {
		if fe, ok := errors.AsType[*settingsfile.Error](err); ok && name == defaultsTable {
			fe.Table = ""
		}
		return start, fallback, err
	}
	return *targets[0].Settings, targets[0].Fallback, nil
}

// tomlValue writes an override's value as the settings file would hold
// it: failure_codes and probe_expect as arrays of strings, fallback and
// probe_payload as strings, a number as a number (a bare
// number of seconds, for a duration), anything else as a string.
func tomlValue(key, value string) string {
	switch key {
	case "failure_codes", "probe_expect":
		var codes []string
		for c := range strings.SplitSeq(value, ",") {
			codes = append(codes, strconv.Quote(strings.TrimSpace(c)))
		}
		return "[" + strings.Join(codes, ", ") + "]"
	case "fallback", "probe_payload":
		return strconv.Quote(value)
	}
	if _, err := strconv.ParseInt(value, 10, 64); err == nil {
		return value
	}
	if f, err := strconv.ParseFloat(value, 64); err == nil && strings.Trim(value, "0123456789.-") == "" && !isInfOrNaN(f) {
		if strings.HasPrefix(value, ".") || strings.HasSuffix(value, ".") {
			// TOML wants a digit on both sides of the point.
			return strconv.FormatFloat(f, 'f', -1, 64)
		}
		return value
	}
	return strconv.Quote(value)
}

func isInfOrNaN(f float64) bool { return f != f || f > 1e308 || f < -1e308 }
