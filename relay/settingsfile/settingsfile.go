// Package settingsfile reads the hub's per-target settings file (--config,
// TOML): a table per target whose keys override the flags' settings for
// that target, and whose tables may add targets and name fallbacks. The
// syntax is in docs/CONFIG.md; every mistake is refused with the file, the
// table and the key in one line.
//
// Each table is decoded into a struct whose field types check their own
// values as BurntSushi/toml reads them; the decoder's metadata tells which
// keys a table sets (MetaData.IsDefined), in what order (MetaData.Keys),
// and which fit no field (MetaData.Undecoded).
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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// Keys of a target's table in the settings file (docs/CONFIG.md).
const (
	keyURL             = "url"
	keyMaxInflight     = "max_inflight"
	keyFailThreshold   = "fail_threshold"
	keyResetTimeout    = "reset_timeout"
	keyTargetTimeout   = "target_timeout"
	keyTargetIdle      = "target_idle_timeout"
	keyFailureCodes    = "failure_codes"
	keyFailureRate     = "failure_rate"
	keyWindow          = "window"
	keyMinSamples      = "min_samples"
	keySlowCall        = "slow_call"
	keyMaxResetTimeout = "max_reset_timeout"
	keyResetJitter     = "reset_jitter"
	keyFallback        = "fallback"
	keyProbePayload    = "probe_payload"
	keyProbeExpect     = "probe_expect"
	keyProbeSuccesses  = "probe_successes"
	keyProbeInterval   = "probe_interval"

	keyAllowedClients     = "allowed_clients"
	keyCAFile             = "ca_file"
	keyClientCert         = "client_cert"
	keyClientKey          = "client_key"
	keyServerName         = "server_name"
	keyInsecureSkipVerify = "insecure_skip_verify"
)

// keyNames are the keys a table may set, in the order an unknown key's
// error lists them.
var keyNames = []string{
	keyURL, keyMaxInflight, keyFailThreshold, keyResetTimeout, keyTargetTimeout,
	keyTargetIdle, keyFailureCodes, keyFailureRate, keyWindow, keyMinSamples, keySlowCall,
	keyMaxResetTimeout, keyResetJitter, keyFallback,
	keyProbePayload, keyProbeExpect, keyProbeSuccesses, keyProbeInterval,
	keyAllowedClients, keyCAFile, keyClientCert, keyClientKey, keyServerName, keyInsecureSkipVerify,
}

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

// Load reads the per-target settings file at path (TOML) and returns the
// targets the hub serves, each with its settings in full and its fallback:
//
//   - the targets are those of base (the --target list, or the default
//     pair), in their order, then those the file adds, in file order;
//   - every target starts from defaults (the flags, as Config's
//     TargetSettings takes them; zero fields select the defaults that
//     TargetSettings documents) and the keys of its table, if it has one,
//     replace those settings one by one;
//   - a table for a target not in base adds that target and must give url;
//     when it does not and its name is within two edits of a target of
//     base (case aside), the error asks whether that target was meant.
//
// The file is strict: an unknown key (keys are case-sensitive), a value of
// the wrong type or out of range (a limit below 1, a rate or jitter outside
// 0 to 1, an unparsable duration, URL or failure code), two tables for one
// target in different case, and a fallback that names no target, the
// target itself, or a target with a fallback of its own (one step only, so
// no cycles) are each refused with a *Error naming the file, the table and
// the key. A max_reset_timeout that is set but not above reset_timeout is
// refused too: backoff could never apply. So are TLS keys (ca_file,
// client_cert, client_key, server_name, insecure_skip_verify) for a target
// whose url is not https, client_cert without client_key or the reverse,
// and a TLS file that cannot be read or used; their paths, when relative,
// are taken from the file's directory, and their files are read here, so
// Target.TLS comes back ready. Of several mistakes, the one
// reported is always the same: the first in file order among the tables
// and keys, else the first bad value in file order, else the first target
// that breaks a rule of the whole file.
func Load(path string, defaults relay.TargetSettings, base []relay.Target) ([]relay.Target, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	return parse(path, string(data), defaults, base)
}

// Parse is Load on data, the contents of a settings file, which errors name
// name: for settings that come from somewhere other than a file of their
// own, such as a command line, and must mean exactly what they would mean
// in one.
func Parse(name, data string, defaults relay.TargetSettings, base []relay.Target) ([]relay.Target, error) {
	return parse(name, data, defaults, base)
}

// fileTarget is one target while the file is read.
type fileTarget struct {
	name     string // canonical
	table    string // as the file writes it; empty when the file has no table for it
	target   relay.Target
	settings relay.TargetSettings
	added    bool // the file adds it: not in base
	tlsFiles tlsfiles.ClientFiles
}

// table is one target's table as the decoder reads it. Only the fields of
// the keys the table sets are filled (md.IsDefined tells which); each
// field's type checks its value as it is decoded.
type table struct {
	URL             targetURL    `toml:"url"`
	MaxInflight     count        `toml:"max_inflight"`
	FailThreshold   count        `toml:"fail_threshold"`
	ResetTimeout    duration     `toml:"reset_timeout"`
	TargetTimeout   duration     `toml:"target_timeout"`
	TargetIdle      duration     `toml:"target_idle_timeout"`
	FailureCodes    failureCodes `toml:"failure_codes"`
	FailureRate     share        `toml:"failure_rate"`
	Window          duration     `toml:"window"`
	MinSamples      count        `toml:"min_samples"`
	SlowCall        offDuration  `toml:"slow_call"`
	MaxResetTimeout offDuration  `toml:"max_reset_timeout"`
	ResetJitter     share        `toml:"reset_jitter"`
	Fallback        targetName   `toml:"fallback"`
	ProbePayload    probePayload `toml:"probe_payload"`
	ProbeExpect     probeCodes   `toml:"probe_expect"`
	ProbeSuccesses  count        `toml:"probe_successes"`
	ProbeInterval   offDuration  `toml:"probe_interval"`

	AllowedClients     clientPatterns `toml:"allowed_clients"`
	CAFile             text           `toml:"ca_file"`
	ClientCert         text           `toml:"client_cert"`
	ClientKey          text           `toml:"client_key"`
	ServerName         text           `toml:"server_name"`
	InsecureSkipVerify flag           `toml:"insecure_skip_verify"`
}

// parse is Load on the file's contents.
//
// The file is checked in three passes, so that of several mistakes the
// same one is always reported: first its shape (every table and key, in
// file order), then its values (in file order), then what only the whole
// file can tell (each target in turn).
func parse(path, data string, defaults relay.TargetSettings, base []relay.Target) ([]relay.Target, error) {
	var prims map[string]toml.Primitive
	md, err := toml.Decode(data, &prims)
	if err != nil {
		if pe := (toml.ParseError{}); errors.As(err, &pe) {
			return nil, &Error{File: path, Line: pe.Position.Line, Key: pe.LastKey, Err: errors.New(pe.Message)}
		}
		return nil, &Error{File: path, Err: err}
	}
	// Every table is decoded before md.Undecoded is read: until then it
	// holds the keys of the tables not yet decoded too. A value that is no
	// table fails to decode and is refused in file order below.
	tables := make(map[string]*table, len(prims))
	for name, prim := range prims {
		var t table
		if md.PrimitiveDecode(prim, &t) == nil {
			tables[name] = &t
		}
	}
	undecoded := make(map[string]bool)
	for _, key := range md.Undecoded() {
		undecoded[key.String()] = true
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
		if tables[table] == nil {
			var v any
			_ = md.PrimitiveDecode(prims[table], &v)
			return nil, fail("", table, "want a table [NAME] of settings for target NAME, got %s", describe(v))
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
			ft.table = table
			return ft, nil
		}
		return nil, fail(table, "", "same target as [%s]: target names are case-insensitive", ft.table)
	}

	for _, key := range md.Keys() {
		if _, err := tableFor(key[0]); err != nil {
			return nil, err
		}
		if len(key) > 1 {
			if err := checkKey(key[1:], undecoded[key.String()]); err != nil {
				return nil, fail(key[0], strings.Join(key[1:], "."), "%w", err)
			}
		}
	}
	for _, key := range md.Keys() {
		if len(key) == 2 {
			if err := byName[strings.ToUpper(key[0])].apply(tables[key[0]], key[1]); err != nil {
				return nil, fail(key[0], key[1], "%w", err)
			}
		}
	}
	for _, ft := range order {
		if err := ft.finish(&md, order, byName); err != nil {
			return nil, &Error{File: path, Table: ft.table, Key: err.key, Err: err.err}
		}
	}
	for _, ft := range order {
		if err := ft.finishTLS(&md, filepath.Dir(path)); err != nil {
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

// checkKey refuses a key of a table (path, below the table's name) that
// sets nothing: one the decoder took for no field (undecoded: a misspelt
// key, a nested table, a dotted key), or one it took for a field spelled
// otherwise, as it matches field names case-insensitively while the file's
// keys are case-sensitive. The keys inside a value the decoder handed to a
// field as a whole (an inline table where a string belongs) are that
// field's to refuse.
func checkKey(path []string, undecoded bool) error {
	if !undecoded {
		if len(path) > 1 || slices.Contains(keyNames, path[0]) {
			return nil
		}
		for _, name := range keyNames {
			if strings.EqualFold(name, path[0]) {
				return fmt.Errorf("unknown key (did you mean %s? keys are case-sensitive)", name)
			}
		}
	}
	for _, name := range keyNames {
		if editDistance(path[0], name) <= suggestDistance {
			return fmt.Errorf("unknown key (did you mean %s?)", name)
		}
	}
	last := len(keyNames) - 1
	return fmt.Errorf("unknown key (want %s or %s)", strings.Join(keyNames[:last], ", "), keyNames[last])
}

// apply sets one key of ft's table, which the decoder read into t.
func (ft *fileTarget) apply(t *table, key string) error {
	s := &ft.settings
	var err error
	switch key {
	case keyURL:
		ft.target.URL, err = t.URL.get()
	case keyMaxInflight:
		s.MaxInflight, err = t.MaxInflight.get()
	case keyFailThreshold:
		s.FailThreshold, err = t.FailThreshold.get()
	case keyMinSamples:
		s.MinSamples, err = t.MinSamples.get()
	case keyResetTimeout:
		s.ResetTimeout, err = t.ResetTimeout.get()
	case keyTargetTimeout:
		s.TargetTimeout, err = t.TargetTimeout.get()
	case keyTargetIdle:
		s.TargetIdleTimeout, err = t.TargetIdle.get()
	case keyWindow:
		s.Window, err = t.Window.get()
	case keySlowCall:
		s.SlowCall, err = t.SlowCall.get()
	case keyMaxResetTimeout:
		s.MaxResetTimeout, err = t.MaxResetTimeout.get()
	case keyFailureRate:
		s.FailureRate, err = t.FailureRate.get()
	case keyResetJitter:
		s.ResetJitter, err = t.ResetJitter.get()
	case keyFailureCodes:
		s.FailureCodes, err = t.FailureCodes.get()
	case keyFallback:
		ft.target.Fallback, err = t.Fallback.get()
	case keyProbePayload:
		s.ProbePayload, err = t.ProbePayload.get()
	case keyProbeExpect:
		s.ProbeExpect, err = t.ProbeExpect.get()
	case keyProbeSuccesses:
		s.ProbeSuccesses, err = t.ProbeSuccesses.get()
	case keyProbeInterval:
		s.ProbeInterval, err = t.ProbeInterval.get()
	default:
		err = ft.applyTLS(t, key)
	}
	return err
}

// cloneSettings returns ts with a FailureCodes and a ProbeExpect of its
// own.
func cloneSettings(ts relay.TargetSettings) relay.TargetSettings {
	ts.FailureCodes = append([]string(nil), ts.FailureCodes...)
	ts.ProbeExpect = slices.Clone(ts.ProbeExpect)
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
func (ft *fileTarget) finish(md *toml.MetaData, order []*fileTarget, byName map[string]*fileTarget) *keyError {
	set := func(key string) bool { return ft.table != "" && md.IsDefined(ft.table, key) }
	if ft.added && !set(keyURL) {
		hint := ""
		if near, ok := nearestBase(ft.name, order); ok {
			hint = " (did you mean [" + near + "]?)"
		}
		return &keyError{keyURL, fmt.Errorf("missing: %s is a target only this file names, so its table must give its url%s", ft.name, hint)}
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
		case set(keyMaxResetTimeout):
			return &keyError{keyMaxResetTimeout, fmt.Errorf("must be more than reset_timeout (%s) for backoff to apply, or 0 for none, got %s", s.ResetTimeout, s.MaxResetTimeout)}
		case set(keyResetTimeout):
			return &keyError{keyResetTimeout, fmt.Errorf("%s leaves no room for backoff up to max_reset_timeout %s: set max_reset_timeout above it, or to 0 for none", s.ResetTimeout, s.MaxResetTimeout)}
		}
	}
	return nil
}

// suggestDistance is the most edits between the name of a table for a new
// target without a url and a target of base for the error to suggest that
// target: two catch a swapped pair of letters, one more or one less.
const suggestDistance = 2

// nearestBase returns the name of the target of base (those the file does
// not add) nearest to name, when it is at most suggestDistance edits away:
// the target a table for a new target without a url most likely meant.
// Names are compared in their canonical upper case; of two as near, the
// first in base wins.
func nearestBase(name string, order []*fileTarget) (string, bool) {
	best, bestDist := "", suggestDistance+1
	for _, o := range order {
		if o.added {
			continue
		}
		if d := editDistance(name, o.name); d < bestDist {
			best, bestDist = o.name, d
		}
	}
	return best, best != ""
}

// editDistance returns the Levenshtein distance between a and b: the
// fewest single-byte insertions, deletions and substitutions that turn a
// into b. Target names are ASCII, so bytes are characters.
func editDistance(a, b string) int {
	// prev[j] is the distance between the first i-1 bytes of a and the
	// first j of b; cur the same for the first i bytes of a.
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			substitute := prev[j-1]
			if a[i-1] != b[j-1] {
				substitute++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, substitute)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// checked is a value of the file as its field type's UnmarshalTOML read
// it, or what is wrong with it. The error is kept rather than returned
// because the decoder reads a table's keys in no fixed order and stops at
// the first error it is given: which of two bad values is reported would
// be left to chance. Kept, the values are judged in file order.
type checked[T any] struct {
	value T
	err   error
}

// get returns the value, or what is wrong with it.
func (c checked[T]) get() (T, error) { return c.value, c.err }

// Field types of table, each checking its TOML value.
type (
	// targetURL is a target's base URL, as relay.ParseTargetURL takes it.
	targetURL struct{ checked[string] }
	// targetName is the canonical name of another target.
	targetName struct{ checked[string] }
	// count is a limit: a whole number, at least 1.
	count struct{ checked[int] }
	// duration is more than zero.
	duration struct{ checked[time.Duration] }
	// offDuration is a duration whose zero turns a policy off.
	offDuration struct{ checked[time.Duration] }
	// share is a failure rate or a jitter, from 0 (off) to 1.
	share struct{ checked[float64] }
	// failureCodes is a non-empty list of failure codes.
	failureCodes struct{ checked[[]string] }
	// probePayload is a synthetic probe's payload: one line, or empty for
	// none.
	probePayload struct{ checked[string] }
	// probeCodes is a non-empty list of a healthy probe's answer codes.
	probeCodes struct{ checked[[]string] }
)

var (
	_ toml.Unmarshaler = (*targetURL)(nil)
	_ toml.Unmarshaler = (*targetName)(nil)
	_ toml.Unmarshaler = (*count)(nil)
	_ toml.Unmarshaler = (*duration)(nil)
	_ toml.Unmarshaler = (*offDuration)(nil)
	_ toml.Unmarshaler = (*share)(nil)
	_ toml.Unmarshaler = (*failureCodes)(nil)
	_ toml.Unmarshaler = (*probePayload)(nil)
	_ toml.Unmarshaler = (*probeCodes)(nil)
)

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *probePayload) UnmarshalTOML(v any) error { f.value, f.err = asProbePayload(v); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *probeCodes) UnmarshalTOML(v any) error { f.value, f.err = asProbeCodes(v); return nil }

// asProbePayload reads a synthetic probe's payload: a string with no line
// break; empty turns synthetic probes off.
func asProbePayload(v any) (string, error) {
	s, err := asString(v)
	if err != nil {
		return "", err
	}
	if strings.ContainsAny(s, "\r\n") {
		return "", errors.New(`must be one line: no "\n" or "\r"`)
	}
	return s, nil
}

// asProbeCodes reads a non-empty array of the answer codes of a healthy
// probe, each accepted by relay.ParseProbeCode; a string of one code, or
// of several separated by commas as the flag takes them, is read too.
func asProbeCodes(v any) ([]string, error) {
	var list []any
	switch x := v.(type) {
	case []any:
		list = x
	case string:
		for c := range strings.SplitSeq(x, ",") {
			list = append(list, strings.TrimSpace(c))
		}
	default:
		return nil, fmt.Errorf(`want an array of codes such as ["0000", "B404"], got %s`, describe(v))
	}
	return parseCodes(list, relay.ParseProbeCode)
}

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *targetURL) UnmarshalTOML(v any) error { f.value, f.err = asURL(v); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *targetName) UnmarshalTOML(v any) error { f.value, f.err = asTargetName(v); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *count) UnmarshalTOML(v any) error { f.value, f.err = asCount(v); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *duration) UnmarshalTOML(v any) error { f.value, f.err = asDuration(v, false); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *offDuration) UnmarshalTOML(v any) error { f.value, f.err = asDuration(v, true); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *share) UnmarshalTOML(v any) error { f.value, f.err = asShare(v); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *failureCodes) UnmarshalTOML(v any) error { f.value, f.err = asFailureCodes(v); return nil }

// asURL reads a target's URL.
func asURL(v any) (string, error) {
	raw, err := asString(v)
	if err != nil {
		return "", err
	}
	if _, err := relay.ParseTargetURL(raw); err != nil {
		return "", err
	}
	return raw, nil
}

// asTargetName reads the name of a target, returning it in upper case.
func asTargetName(v any) (string, error) {
	name, err := asString(v)
	if err != nil {
		return "", err
	}
	if !protocol.ValidTxID([]byte(name)) {
		return "", fmt.Errorf("%q is no target name: want 1 to 64 of A-Z a-z 0-9 . _ : -", name)
	}
	return strings.ToUpper(name), nil
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
	return parseCodes(list, protocol.ParseFailureCode)
}

// parseCodes reads a non-empty list of codes, each a string that parse
// accepts, into the codes parse returns.
func parseCodes(list []any, parse func(string) (string, error)) ([]string, error) {
	if len(list) == 0 {
		return nil, errors.New("name at least one code")
	}
	codes := make([]string, 0, len(list))
	for _, x := range list {
		s, ok := x.(string)
		if !ok {
			return nil, fmt.Errorf("want codes as strings, got %s", describe(x))
		}
		code, err := parse(s)
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
