package settingsfile

import (
	"errors"
	"fmt"

	"github.com/BurntSushi/toml"

	"github.com/relayhub/relayhub/relay/resolver"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// Field types of the keys that settle transactions in doubt.
type (
	// resolvePolicy is resolve: lookup, reverse or manual.
	resolvePolicy struct{ checked[resolver.Policy] }
	// reverseURL is a target's reversal URL template, as
	// targethttp.CheckReverseURL takes it.
	reverseURL struct{ checked[string] }
)

var (
	_ toml.Unmarshaler = (*resolvePolicy)(nil)
	_ toml.Unmarshaler = (*reverseURL)(nil)
)

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *resolvePolicy) UnmarshalTOML(v any) error {
	s, err := asString(v)
	switch p := resolver.Policy(s); {
	case err != nil:
		f.err = err
	case p == resolver.PolicyLookup || p == resolver.PolicyReverse || p == resolver.PolicyManual:
		f.value = p
	default:
		f.err = fmt.Errorf(`want "lookup", "reverse" or "manual", got %q`, s)
	}
	return nil
}

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *reverseURL) UnmarshalTOML(v any) error {
	raw, err := asString(v)
	if err == nil {
		err = targethttp.CheckReverseURL(raw)
	}
	f.value, f.err = raw, err
	return nil
}

// applyResolve sets one of the keys that settle transactions in doubt.
func (ft *fileTarget) applyResolve(t *table, key string) error {
	s := &ft.settings
	var err error
	switch key {
	case keyResolve:
		s.Resolve, err = t.Resolve.get()
	case keyReverseURL:
		ft.target.ReverseURL, err = t.ReverseURL.get()
	case keyResolveAfter:
		s.ResolveAfter, err = t.ResolveAfter.get()
	case keyResolveMax:
		s.ResolveMaxInterval, err = t.ResolveMax.get()
	case keyResolveExpire:
		s.ResolveExpire, err = t.ResolveExpire.get()
	case keyLateGrace:
		s.LateAnswerGrace, err = t.LateGrace.get()
		s.NoLateAnswer = err == nil && s.LateAnswerGrace == 0
	default:
		err = errors.New("not a resolve key")
	}
	return err
}

// resolveError says why ft's resolve policy cannot work, at the key that
// chose it (resolve; the target has the default otherwise, which always
// works).
func (ft *fileTarget) resolveError(set func(string) bool) *keyError {
	key := keyResolve
	if !set(keyResolve) {
		key = ""
	}
	switch ft.settings.Resolve {
	case resolver.PolicyLookup:
		return &keyError{key, errors.New(`"lookup" needs status_url: the URL the hub asks whether the target applied a transaction`)}
	case resolver.PolicyReverse:
		return &keyError{key, errors.New(`"reverse" needs reverse_url: the URL, holding {txid}, the hub posts a reversal to`)}
	}
	return &keyError{key, fmt.Errorf("%q: want lookup, reverse or manual", ft.settings.Resolve)}
}
