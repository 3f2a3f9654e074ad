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
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// Keys of a target's table in the settings file (docs/CONFIG.md).
const (
	keyURL             = "url"
	keyMaxInflight     = "max_inflight"
	keyAdaptiveLimit   = "adaptive_limit"
	keyMinInflight     = "min_inflight"
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
	keyDedup           = "dedup"
	keyDedupWindow     = "dedup_window"
	keyDedupScope      = "dedup_scope"
	keyStatusURL       = "status_url"
	keyResolve         = "resolve"
	keyReverseURL      = "reverse_url"
	keyResolveAfter    = "resolve_after"
	keyResolveMax      = "resolve_max_interval"
	keyResolveExpire   = "resolve_expire"
	keyLateGrace       = "late_answer_grace"

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
	keyMaxResetTimeout, keyResetJitter, keyAdaptiveLimit, keyMinInflight, keyFallback,
	keyProbePayload, keyProbeExpect, keyProbeSuccesses, keyProbeInterval,
	keyDedup, keyDedupWindow, keyDedupScope, keyStatusURL,
	keyResolve, keyReverseURL, keyResolveAfter, keyResolveMax, keyResolveExpire, keyLateGrace,
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
	URL             targetURL     `toml:"url"`
	MaxInflight     count         `toml:"max_inflight"`
	AdaptiveLimit   limitMode     `toml:"adaptive_limit"`
	MinInflight     count         `toml:"min_inflight"`
	FailThreshold   count         `toml:"fail_threshold"`
	ResetTimeout    duration      `toml:"reset_timeout"`
	TargetTimeout   duration      `toml:"target_timeout"`
	TargetIdle      duration      `toml:"target_idle_timeout"`
	FailureCodes    failureCodes  `toml:"failure_codes"`
	FailureRate     share         `toml:"failure_rate"`
	Window          duration      `toml:"window"`
	MinSamples      count         `toml:"min_samples"`
	SlowCall        offDuration   `toml:"slow_call"`
	MaxResetTimeout offDuration   `toml:"max_reset_timeout"`
	ResetJitter     share         `toml:"reset_jitter"`
	Fallback        targetName    `toml:"fallback"`
	ProbePayload    probePayload  `toml:"probe_payload"`
	ProbeExpect     probeCodes    `toml:"probe_expect"`
	ProbeSuccesses  count         `toml:"probe_successes"`
	ProbeInterval   offDuration   `toml:"probe_interval"`
	Dedup           flag          `toml:"dedup"`
	DedupWindow     duration      `toml:"dedup_window"`
	DedupScope      dedupScope    `toml:"dedup_scope"`
	StatusURL       statusURL     `toml:"status_url"`
	Resolve         resolvePolicy `toml:"resolve"`
	ReverseURL      reverseURL    `toml:"reverse_url"`
	ResolveAfter    duration      `toml:"resolve_after"`
	ResolveMax      duration      `toml:"resolve_max_interval"`
	ResolveExpire   duration      `toml:"resolve_expire"`
	LateGrace       offDuration   `toml:"late_answer_grace"`

	AllowedClients     clientPatterns `toml:"allowed_clients"`
	CAFile             text           `toml:"ca_file"`
	ClientCert         text           `toml:"client_cert"`
	ClientKey          text           `toml:"client_key"`
	ServerName         text           `toml:"server_name"`
	InsecureSkipVerify flag           `toml:"insecure_skip_verify"`
}

// errorLine returns the line of data a TOML syntax error at pos is on.
// The parser counts a line break it has read as the start of the next
// line, so a line cut short ("[CORE" and its line break) would be reported
// on the line after it; the error's byte offset says where it is.
func errorLine(data string, pos toml.Position) int {
	if pos.Start < 0 || pos.Start > len(data) {
		return pos.Line
	}
	return 1 + strings.Count(data[:pos.Start], "\n")
}

// parse is Load on the file's contents.
//
// The file is checked in three passes, so that of several mistakes the
// same one is always reported: first its shape (every table and key, in
// file order), then its values (in file order), then what only the whole
// file can tell (each target in turn).
func parse(path, data string, defaults relay.TargetSettings, base []relay.Target) ([]relay.Target, error) {
	d, err := decode(path, data)
	if err != nil {
		return nil, err
	}
	if err := d.addBase(defaults.WithDefaults(), base); err != nil {
		return nil, err
	}
	if err := d.checkShape(); err != nil {
		return nil, err
	}
	if err := d.applyValues(); err != nil {
		return nil, err
	}
	if err := d.checkWhole(); err != nil {
		return nil, err
	}
	out := make([]relay.Target, len(d.order))
	for i, ft := range d.order {
		out[i] = ft.target
		s := ft.settings
		out[i].Settings = &s
	}
	return out, nil
}

// doc is one settings file while parse reads it. It is not safe for
// concurrent use.
type doc struct {
	path      string
	md        toml.MetaData
	prims     map[string]toml.Primitive
	tables    map[string]*table // the values of prims that are tables
	undecoded map[string]bool   // the keys no field of table has

	defaults relay.TargetSettings // filled in
	order    []*fileTarget        // base's targets, then those the file adds
	byName   map[string]*fileTarget
}

// decode decodes data, the file at path, into a doc.
func decode(path, data string) (*doc, error) {
	d := &doc{path: path, byName: make(map[string]*fileTarget)}
	md, err := toml.Decode(data, &d.prims)
	if err != nil {
		if pe := (toml.ParseError{}); errors.As(err, &pe) {
			return nil, &Error{File: path, Line: errorLine(data, pe.Position), Key: pe.LastKey, Err: errors.New(pe.Message)}
		}
		return nil, &Error{File: path, Err: err}
	}
	d.md = md
	// Every table is decoded before md.Undecoded is read: until then it
	// holds the keys of the tables not yet decoded too. A value that is no
	// table fails to decode and is refused in file order by tableFor.
	d.tables = make(map[string]*table, len(d.prims))
	for name, prim := range d.prims {
		var t table
		if d.md.PrimitiveDecode(prim, &t) == nil {
			d.tables[name] = &t
		}
	}
	d.undecoded = make(map[string]bool)
	for _, key := range d.md.Undecoded() {
		d.undecoded[key.String()] = true
	}
	return d, nil
}

// addBase starts the targets with base's, each on defaults.
func (d *doc) addBase(defaults relay.TargetSettings, base []relay.Target) error {
	d.defaults = defaults
	for _, t := range base {
		name := strings.ToUpper(t.Name)
		if d.byName[name] != nil {
			return fmt.Errorf("relay: target %s given twice", name)
		}
		ft := &fileTarget{name: name, target: t, settings: cloneSettings(defaults)}
		ft.target.Name = name
		d.byName[name] = ft
		d.order = append(d.order, ft)
	}
	return nil
}

// fail returns the *Error of key in table.
func (d *doc) fail(table, key string, format string, args ...any) error {
	return &Error{File: d.path, Table: table, Key: key, Err: fmt.Errorf(format, args...)}
}

// tableFor returns the target of a table, checking the table the first
// time it is met.
func (d *doc) tableFor(table string) (*fileTarget, error) {
	if d.tables[table] == nil {
		var v any
		_ = d.md.PrimitiveDecode(d.prims[table], &v)
		return nil, d.fail("", table, "want a table [NAME] of settings for target NAME, got %s", describe(v))
	}
	if !protocol.ValidTxID([]byte(table)) {
		return nil, d.fail(table, "", "target name: want 1 to 64 of A-Z a-z 0-9 . _ : -")
	}
	name := strings.ToUpper(table)
	ft := d.byName[name]
	if ft == nil {
		ft = &fileTarget{name: name, target: relay.Target{Name: name}, settings: cloneSettings(d.defaults), added: true}
		d.byName[name] = ft
		d.order = append(d.order, ft)
	}
	switch ft.table {
	case table:
		return ft, nil
	case "":
		ft.table = table
		return ft, nil
	}
	return nil, d.fail(table, "", "same target as [%s]: target names are case-insensitive", ft.table)
}

// checkShape is the first pass: every table and key, in file order.
func (d *doc) checkShape() error {
	for _, key := range d.md.Keys() {
		if _, err := d.tableFor(key[0]); err != nil {
			return err
		}
		if len(key) > 1 {
			if err := checkKey(key[1:], d.undecoded[key.String()]); err != nil {
				return d.fail(key[0], strings.Join(key[1:], "."), "%w", err)
			}
		}
	}
	return nil
}

// applyValues is the second pass: every value, in file order, onto its
// target's settings.
func (d *doc) applyValues() error {
	for _, key := range d.md.Keys() {
		if len(key) == 2 {
			if err := d.byName[strings.ToUpper(key[0])].apply(d.tables[key[0]], key[1]); err != nil {
				return d.fail(key[0], key[1], "%w", err)
			}
		}
	}
	return nil
}

// checkWhole is the third pass: what only the whole file can tell, each
// target in turn, then each target's TLS files.
func (d *doc) checkWhole() error {
	for _, ft := range d.order {
		if err := ft.finish(&d.md, d.order, d.byName); err != nil {
			return &Error{File: d.path, Table: ft.table, Key: err.key, Err: err.err}
		}
	}
	for _, ft := range d.order {
		if err := ft.finishTLS(&d.md, filepath.Dir(d.path)); err != nil {
			return &Error{File: d.path, Table: ft.table, Key: err.key, Err: err.err}
		}
	}
	return nil
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
	case keyAdaptiveLimit:
		s.AdaptiveLimit, err = t.AdaptiveLimit.get()
	case keyMinInflight:
		s.MinInflight, err = t.MinInflight.get()
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
	case keyDedup:
		s.Dedup, err = t.Dedup.get()
	case keyDedupWindow:
		s.DedupWindow, err = t.DedupWindow.get()
	case keyDedupScope:
		s.DedupScope, err = t.DedupScope.get()
	case keyStatusURL:
		ft.target.StatusURL, err = t.StatusURL.get()
	case keyResolve, keyReverseURL, keyResolveAfter, keyResolveMax, keyResolveExpire, keyLateGrace:
		err = ft.applyResolve(t, key)
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
	if _, err := ft.target.ResolvePolicy(ft.settings); err != nil {
		return ft.resolveError(set)
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
