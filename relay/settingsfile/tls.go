package settingsfile

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// tlsKeys are the keys of a target's TLS client settings, in the order
// their mistakes are reported.
var tlsKeys = []string{keyCAFile, keyClientCert, keyClientKey, keyServerName, keyInsecureSkipVerify}

// Field types of table for the TLS keys, each checking its TOML value.
type (
	// clientPatterns is a non-empty list of allowed_clients patterns.
	clientPatterns struct{ checked[[]string] }
	// text is a string that is not empty: a file's path, a server name.
	text struct{ checked[string] }
	// flag is a boolean.
	flag struct{ checked[bool] }
)

var _ = []toml.Unmarshaler{(*clientPatterns)(nil), (*text)(nil), (*flag)(nil)}

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *clientPatterns) UnmarshalTOML(v any) error { f.value, f.err = asPatterns(v); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *text) UnmarshalTOML(v any) error { f.value, f.err = asNonEmpty(v); return nil }

// UnmarshalTOML implements toml.Unmarshaler; it never fails (see checked).
func (f *flag) UnmarshalTOML(v any) error {
	b, ok := v.(bool)
	if !ok {
		f.err = fmt.Errorf("want true or false, got %s", describe(v))
	}
	f.value = b
	return nil
}

// asPatterns reads allowed_clients: a non-empty array of non-empty
// strings without control characters.
func asPatterns(v any) ([]string, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf(`want an array of client patterns such as ["branch-*", "partner-acme"], got %s`, describe(v))
	}
	if len(list) == 0 {
		return nil, errors.New("name at least one client pattern; leave the key out to allow every client")
	}
	out := make([]string, 0, len(list))
	for _, x := range list {
		p, err := asNonEmpty(x)
		if err != nil {
			return nil, err
		}
		if strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return nil, fmt.Errorf("pattern %q holds a control character", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// asNonEmpty reads a string that is not empty.
func asNonEmpty(v any) (string, error) {
	s, err := asString(v)
	if err == nil && strings.TrimSpace(s) == "" {
		err = errors.New("must not be empty")
	}
	return s, err
}

// applyTLS sets one TLS key of ft's table, which the decoder read into t.
func (ft *fileTarget) applyTLS(t *table, key string) (err error) {
	f := &ft.tlsFiles
	texts := map[string]struct {
		dst *string
		src text
	}{
		keyCAFile: {&f.CAFile, t.CAFile}, keyClientCert: {&f.CertFile, t.ClientCert},
		keyClientKey: {&f.KeyFile, t.ClientKey}, keyServerName: {&f.ServerName, t.ServerName},
	}
	if v, ok := texts[key]; ok {
		*v.dst, err = v.src.get()
		return err
	}
	switch key {
	case keyAllowedClients:
		ft.target.AllowedClients, err = t.AllowedClients.get()
	case keyInsecureSkipVerify:
		f.InsecureSkipVerify, err = t.InsecureSkipVerify.get()
	}
	return err
}

// finishTLS builds the TLS configuration of a target whose table sets TLS
// keys, reading the files they name (a relative path is taken from dir,
// the settings file's directory): only for an https target, with
// client_cert and client_key together, and every file readable and
// good.
func (ft *fileTarget) finishTLS(md *toml.MetaData, dir string) *keyError {
	set := func(key string) bool { return ft.table != "" && md.IsDefined(ft.table, key) }
	first := ""
	for _, key := range tlsKeys {
		if set(key) {
			first = key
			break
		}
	}
	if first == "" {
		return nil
	}
	if !strings.HasPrefix(strings.ToLower(ft.target.URL), "https://") {
		return &keyError{first, fmt.Errorf("TLS settings need an https:// url, and %s's is %q", ft.name, ft.target.URL)}
	}
	switch {
	case set(keyClientCert) && !set(keyClientKey):
		return &keyError{keyClientKey, errors.New("missing: client_cert needs its key")}
	case set(keyClientKey) && !set(keyClientCert):
		return &keyError{keyClientCert, errors.New("missing: client_key needs its certificate")}
	}
	f := &ft.tlsFiles
	for _, p := range []*string{&f.CAFile, &f.CertFile, &f.KeyFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	if f.CAFile != "" {
		if _, err := tlsfiles.LoadPool(f.CAFile); err != nil {
			return &keyError{keyCAFile, err}
		}
	}
	cfg, err := tlsfiles.Client(*f)
	if err != nil {
		// The CA file read well just now: what is wrong is the client
		// certificate or its key, and the message names the file.
		return &keyError{keyClientCert, err}
	}
	ft.target.TLS = cfg
	return nil
}
