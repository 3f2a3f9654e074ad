// Package settingsfile reads the hub's per-target settings file (--config,
// TOML): a table per target whose keys override the flags' settings for
// that target, and whose tables may add targets and name fallbacks. The
// syntax is in docs/CONFIG.md; every mistake is refused with the file, the
// table and the key in one line.
//
// Typical use:
//
//	targets, err := settingsfile.Load("relay.toml", flagDefaults, flagTargets)
//	if err != nil {
//		return err // config relay.toml: [CORE] max_inflight: must be at least 1, got 0
//	}
//	srv, err := relay.New(relay.Config{Targets: targets, TargetSettings: flagDefaults})
package settingsfile

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
)

// Keys of a target's table in the settings file (docs/CONFIG.md).
const (
	keyURL             = "url"
	keyMaxInflight     = "max_inflight"
	keyFailThreshold   = "fail_threshold"
	keyResetTimeout    = "reset_timeout"
	keyTargetTimeout   = "target_timeout"
	keyFailureCodes    = "failure_codes"
	keyFailureRate     = "failure_rate"
	keyWindow          = "window"
	keyMinSamples      = "min_samples"
	keySlowCall        = "slow_call"
	keyMaxResetTimeout = "max_reset_timeout"
	keyResetJitter     = "reset_jitter"
	keyFallback        = "fallback"
)

// Error reports what is wrong with a per-target settings file: the
// file, and where known the line, the table (the target's name as the file
// writes it) and the key. Its message is one line. It is an immutable
// value, safe for concurrent use.
type Error struct {
	// File is the path the file was read from.
	File string
	// Line is the line of a TOML syntax error, else zero.
	Line int
	// Table is the target's table, as written in the file; empty for an
	// error about the whole file.
	Table string
	// Key is the key within Table (or, for a syntax error, the last key
	// read); empty when the error is about the table itself.
	Key string
	// Err is what is wrong.
	Err error
}

// Error returns "config FILE: [TABLE] KEY: what is wrong", leaving out what
// is not known.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config ")
	b.WriteString(e.File)
	b.WriteString(": ")
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		if e.Key != "" {
			b.WriteString(" (after key " + e.Key + ")")
		}
		b.WriteString(": ")
	} else {
		if e.Table != "" {
			b.WriteString("[" + e.Table + "] ")
		}
		if e.Key != "" {
			b.WriteString(e.Key)
			b.WriteString(": ")
		}
	}
	// A line break would split the one line an operator reads.
	b.WriteString(strings.Join(strings.Fields(e.Err.Error()), " "))
	return b.String()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Load reads the per-target settings file at path (TOML) and returns the targets the hub serves, each with its settings in
// full and its fallback:
//
//   - the targets are those of base (the --target list, or the default
//     pair), in their order, then those the file adds, in file order;
//   - every target starts from defaults (the flags, as Config's
//     TargetSettings takes them; zero fields select the defaults that
//     TargetSettings documents) and the keys of its table, if it has one,
//     replace those settings one by one;
//   - a table for a target not in base adds that target and must give url.
//
// The file is strict: an unknown key, a value of the wrong type or out of
// range (a limit below 1, a rate or jitter outside 0 to 1, an unparsable
// duration, URL or failure code), two tables for one target in different
// case, and a fallback that names no target, the target itself, or a
// target with a fallback of its own (one step only, so no cycles) are each
// refused with a *Error naming the file, the table and the key. A
// max_reset_timeout that is set but not above reset_timeout is refused
// too: backoff could never apply.
func Load(path string, defaults relay.TargetSettings, base []relay.Target) ([]relay.Target, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	return parse(path, string(data), defaults, base)
}

// fileTarget is one target while the file is read.
type fileTarget struct {
	name     string // canonical
	table    string // as the file writes it; empty when the file has no table for it
	target   relay.Target
	settings relay.TargetSettings
	added    bool            // the file adds it: not in base
	set      map[string]bool // keys its table set
}

// parse is Load on the file's contents.
func parse(path, data string, defaults relay.TargetSettings, base []relay.Target) ([]relay.Target, error) {
	var raw map[string]any
	md, err := toml.Decode(data, &raw)
	if err != nil {
		if pe := (toml.ParseError{}); errors.As(err, &pe) {
			return nil, &Error{File: path, Line: pe.Position.Line, Key: pe.LastKey, Err: errors.New(pe.Message)}
		}
		return nil, &Error{File: path, Err: err}
	}
	defaults = defaults.WithDefaults()
	var (
		order  []*fileTarget
		byName = make(map[string]*fileTarget)
	)
	for _, t := range base {
		name := strings.ToUpper(t.Name)
		if byName[name] != nil {
			return nil, fmt.Errorf("relay: target %s given twice", name)
		}
		ft := &fileTarget{name: name, target: t, settings: cloneSettings(defaults)}
		ft.target.Name = name
		byName[name] = ft
		order = append(order, ft)
	}
	fail := func(table, key string, format string, args ...any) error {
		return &Error{File: path, Table: table, Key: key, Err: fmt.Errorf(format, args...)}
	}
	// tableFor returns the target of a table, checking the table the first
	// time it is met.
	tableFor := func(table string) (*fileTarget, error) {
		if _, ok := raw[table].(map[string]any); !ok {
			return nil, fail("", table, "want a table [NAME] of settings for target NAME, got %s", describe(raw[table]))
		}
		if !protocol.ValidTxID([]byte(table)) {
			return nil, fail(table, "", "target name: want 1 to 64 of A-Z a-z 0-9 . _ : -")
		}
		name := strings.ToUpper(table)
		ft := byName[name]
		if ft == nil {
			ft = &fileTarget{name: name, target: relay.Target{Name: name}, settings: cloneSettings(defaults), added: true}
			byName[name] = ft
			order = append(order, ft)
		}
		switch ft.table {
		case table:
			return ft, nil
		case "":
			ft.table, ft.set = table, make(map[string]bool)
			return ft, nil
		}
		return nil, fail(table, "", "same target as [%s]: target names are case-insensitive", ft.table)
	}

	for _, key := range md.Keys() {
		ft, err := tableFor(key[0])
		if err != nil {
			return nil, err
		}
		if len(key) == 1 {
			continue
		}
		if len(key) > 2 {
			// [CORE.sub] or CORE.a.b: the first part was refused already
			// unless it is a key of its own.
			return nil, fail(ft.table, strings.Join(key[1:], "."), "unknown key")
		}
		name := key[1]
		value := raw[key[0]].(map[string]any)[name]
		if err := ft.apply(name, value); err != nil {
			return nil, fail(ft.table, name, "%w", err)
		}
		ft.set[name] = true
	}

	for _, ft := range order {
		if err := ft.finish(order, byName); err != nil {
			return nil, &Error{File: path, Table: ft.table, Key: err.key, Err: err.err}
		}
	}
	out := make([]relay.Target, len(order))
	for i, ft := range order {
		out[i] = ft.target
		s := ft.settings
		out[i].Settings = &s
	}
	return out, nil
}

// cloneSettings returns ts with a FailureCodes of its own.
func cloneSettings(ts relay.TargetSettings) relay.TargetSettings {
	ts.FailureCodes = append([]string(nil), ts.FailureCodes...)
	return ts
}

// keyError is what is wrong with one key of a table, before the file and
// the table are known to the caller.
type keyError struct {
	key string
	err error
}

// finish checks what only the whole file can tell: a target the file adds
// has a url, its fallback is a configured target with no fallback of its
// own, and backoff can apply where its table sets it.
func (ft *fileTarget) finish(order []*fileTarget, byName map[string]*fileTarget) *keyError {
	if ft.added && !ft.set[keyURL] {
		return &keyError{keyURL, fmt.Errorf("missing: %s is a target only this file names, so its table must give its url", ft.name)}
	}
	if fb := ft.target.Fallback; fb != "" {
		other := byName[fb]
		switch {
		case other == nil:
			names := make([]string, len(order))
			for i, o := range order {
				names[i] = o.name
			}
			return &keyError{keyFallback, fmt.Errorf("no target %s (targets: %s)", fb, strings.Join(names, ", "))}
		case other == ft:
			return &keyError{keyFallback, fmt.Errorf("%s cannot fall back to itself", ft.name)}
		case other.target.Fallback != "":
			return &keyError{keyFallback, fmt.Errorf("%s has a fallback of its own (%s): fallbacks go one step, with no chains or cycles", fb, other.target.Fallback)}
		}
	}
	s := ft.settings
	if s.MaxResetTimeout > 0 && s.MaxResetTimeout <= s.ResetTimeout {
		switch {
		case ft.set[keyMaxResetTimeout]:
			return &keyError{keyMaxResetTimeout, fmt.Errorf("must be more than reset_timeout (%s) for backoff to apply, or 0 for none, got %s", s.ResetTimeout, s.MaxResetTimeout)}
		case ft.set[keyResetTimeout]:
			return &keyError{keyResetTimeout, fmt.Errorf("%s leaves no room for backoff up to max_reset_timeout %s: set max_reset_timeout above it, or to 0 for none", s.ResetTimeout, s.MaxResetTimeout)}
		}
	}
	return nil
}

// apply sets one key of ft's table from its TOML value.
func (ft *fileTarget) apply(key string, v any) error {
	s := &ft.settings
	var err error
	switch key {
	case keyURL:
		var raw string
		if raw, err = asString(v); err == nil {
			if _, err = relay.ParseTargetURL(raw); err == nil {
				ft.target.URL = raw
			}
		}
	case keyMaxInflight:
		s.MaxInflight, err = asCount(v)
	case keyFailThreshold:
		s.FailThreshold, err = asCount(v)
	case keyMinSamples:
		s.MinSamples, err = asCount(v)
	case keyResetTimeout:
		s.ResetTimeout, err = asDuration(v, false)
	case keyTargetTimeout:
		s.TargetTimeout, err = asDuration(v, false)
	case keyWindow:
		s.Window, err = asDuration(v, false)
	case keySlowCall:
		s.SlowCall, err = asDuration(v, true)
	case keyMaxResetTimeout:
		s.MaxResetTimeout, err = asDuration(v, true)
	case keyFailureRate:
		s.FailureRate, err = asShare(v)
	case keyResetJitter:
		s.ResetJitter, err = asShare(v)
	case keyFailureCodes:
		s.FailureCodes, err = asFailureCodes(v)
	case keyFallback:
		var name string
		if name, err = asString(v); err == nil {
			if !protocol.ValidTxID([]byte(name)) {
				err = fmt.Errorf("%q is no target name: want 1 to 64 of A-Z a-z 0-9 . _ : -", name)
			} else {
				ft.target.Fallback = strings.ToUpper(name)
			}
		}
	default:
		return errors.New("unknown key (want url, max_inflight, fail_threshold, reset_timeout, target_timeout, failure_codes, failure_rate, window, min_samples, slow_call, max_reset_timeout, reset_jitter or fallback)")
	}
	return err
}

// asString reads a TOML string.
func asString(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("want a string, got %s", describe(v))
	}
	return s, nil
}

// asCount reads a limit: a whole number, at least 1.
func asCount(v any) (int, error) {
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("want a whole number, got %s", describe(v))
	}
	if n < 1 {
		return 0, fmt.Errorf("must be at least 1, got %d", n)
	}
	if n > math.MaxInt32 {
		return 0, fmt.Errorf("must be at most %d, got %d", math.MaxInt32, n)
	}
	return int(n), nil
}

// asDuration reads a duration: a string in the flags' syntax ("30s",
// "500ms", "10") or a number of seconds. It must be more than zero, or,
// with zeroIsOff, may be zero to turn a policy off.
func asDuration(v any, zeroIsOff bool) (time.Duration, error) {
	var (
		d   time.Duration
		err error
	)
	switch x := v.(type) {
	case string:
		d, err = ParseDuration(x)
	case int64:
		d, err = secondsDuration(float64(x))
	case float64:
		d, err = secondsDuration(x)
	default:
		return 0, fmt.Errorf(`want a duration such as "30s", "500ms" or a number of seconds, got %s`, describe(v))
	}
	switch {
	case err != nil:
		return 0, err
	case d < 0:
		return 0, fmt.Errorf("must not be negative, got %s", d)
	case d == 0 && !zeroIsOff:
		return 0, errors.New("must be more than zero, got 0")
	}
	return d, nil
}

// secondsDuration converts a number of seconds, refusing what does not fit
// a time.Duration.
func secondsDuration(secs float64) (time.Duration, error) {
	if math.IsNaN(secs) || math.Abs(secs) > float64(math.MaxInt64)/float64(time.Second) {
		return 0, fmt.Errorf("%v seconds is not a usable duration", secs)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// asShare reads a failure rate or a jitter: a number from 0 (off) to 1.
func asShare(v any) (float64, error) {
	var f float64
	switch x := v.(type) {
	case int64:
		f = float64(x)
	case float64:
		f = x
	default:
		return 0, fmt.Errorf("want a number from 0 to 1, got %s", describe(v))
	}
	if !(f >= 0 && f <= 1) {
		return 0, fmt.Errorf("must be from 0 (off) to 1, got %v", f)
	}
	return f, nil
}

// asFailureCodes reads a non-empty array of failure codes, each accepted by
// protocol.ParseFailureCode.
func asFailureCodes(v any) ([]string, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf(`want an array of codes such as ["E500", "E901", "E902"], got %s`, describe(v))
	}
	if len(list) == 0 {
		return nil, errors.New("name at least one code")
	}
	codes := make([]string, 0, len(list))
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			return nil, fmt.Errorf("want codes as strings, got %s", describe(x))
		}
		code, err := protocol.ParseFailureCode(s)
		if err != nil {
			return nil, err
		}
		codes = append(codes, code)
	}
	return codes, nil
}

// describe names a TOML value for an error message.
func describe(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case int64:
		return "the number " + strconv.FormatInt(x, 10)
	case float64:
		return "the number " + strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	case nil:
		return "nothing"
	default:
		return "a date or time"
	}
}

// ParseDuration reads a duration as the flags and the per-target settings
// file take it: Go's syntax ("500ms", "30s", "5m") or a bare number of
// seconds ("10", "0.5"). A negative one ("-1", "-2s") is read too, so that
// the caller's range check, not a syntax error, says what is wrong with it.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if num := strings.TrimPrefix(s, "-"); num != "" && strings.Trim(num, "0123456789.") == "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || math.Abs(secs) > float64(math.MaxInt64)/float64(time.Second) {
			return 0, fmt.Errorf("duration %q: want a number of seconds or a duration like 500ms", s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want a number of seconds or a duration like 500ms", s)
	}
	return v, nil
}
