package settingsfile

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
)

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
	// statusURL is a target's look-up URL, as relay.CheckStatusURL takes
	// it.
	statusURL struct{ checked[string] }
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
	// dedupScope is the shield's scope: identity or target.
	dedupScope struct{ checked[relay.DedupScope] }
	// limitMode is adaptive_limit: true, false or "observe".
	limitMode struct{ checked[relay.LimitMode] }
)

var (
	_ toml.Unmarshaler = (*targetURL)(nil)
	_ toml.Unmarshaler = (*targetName)(nil)
	_ toml.Unmarshaler = (*statusURL)(nil)
	_ toml.Unmarshaler = (*count)(nil)
	_ toml.Unmarshaler = (*duration)(nil)
	_ toml.Unmarshaler = (*offDuration)(nil)
	_ toml.Unmarshaler = (*share)(nil)
	_ toml.Unmarshaler = (*failureCodes)(nil)
	_ toml.Unmarshaler = (*probePayload)(nil)
	_ toml.Unmarshaler = (*probeCodes)(nil)
	_ toml.Unmarshaler = (*dedupScope)(nil)
	_ toml.Unmarshaler = (*limitMode)(nil)
)

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *dedupScope) UnmarshalTOML(v any) error {
	s, err := asString(v)
	if err == nil {
		f.value, err = relay.ParseDedupScope(s)
	}
	f.err = err
	return nil
}

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *limitMode) UnmarshalTOML(v any) error {
	switch v {
	case true:
		f.value = relay.LimitAdaptive
	case false:
		f.value = relay.LimitStatic
	case "observe":
		f.value = relay.LimitObserve
	default:
		f.err = fmt.Errorf(`want true, false or "observe", got %s`, describe(v))
	}
	return nil
}

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

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *statusURL) UnmarshalTOML(v any) error {
	raw, err := asString(v)
	if err == nil {
		err = relay.CheckStatusURL(raw)
	}
	f.value, f.err = raw, err
	return nil
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
