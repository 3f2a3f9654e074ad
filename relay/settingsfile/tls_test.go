package settingsfile

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/certtest"
	"github.com/relayhub/relayhub/relay"
)

func TestLoadTargetTLSAndAllowedClients(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "back-end CA")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "pki"), 0o700))
	ca.WriteFile(t, filepath.Join(dir, "pki"), "core-ca")
	ca.Client(t, "relayhub").WriteFiles(t, filepath.Join(dir, "pki"), "relayhub")
	absCA := ca.WriteFile(t, t.TempDir(), "abs-ca")
	path := filepath.Join(dir, "relay.toml")
	require.NoError(t, os.WriteFile(path, []byte(`
[CORE]
url = "https://core.bank.internal:8443"
ca_file = "pki/core-ca.pem"
client_cert = "pki/relayhub.crt"
client_key = "pki/relayhub.key"
server_name = "core"
allowed_clients = ["branch-*", "spiffe://bank/teller"]

[CLAIM]
allowed_clients = ["partner-acme"]

[LAB]
url = "https://lab.internal"
ca_file = "`+absCA+`"
insecure_skip_verify = true
`), 0o600))

	targets, err := Load(path, flagDefaults, defaultPair)
	require.NoError(t, err)

	core := byName(t, targets, "CORE")
	assert.Equal(t, []string{"branch-*", "spiffe://bank/teller"}, core.AllowedClients)
	require.NotNil(t, core.TLS, "paths are taken from the file's directory")
	assert.Equal(t, "core", core.TLS.ServerName)
	assert.False(t, core.TLS.InsecureSkipVerify)
	require.Len(t, core.TLS.Certificates, 1)
	assert.Equal(t, "relayhub", core.TLS.Certificates[0].Leaf.Subject.CommonName)
	_, err = ca.Server(t).Cert.Verify(x509Roots(core.TLS.RootCAs))
	assert.NoError(t, err, "the target is verified against ca_file")

	claim := byName(t, targets, "CLAIM")
	assert.Equal(t, []string{"partner-acme"}, claim.AllowedClients, "allowed_clients work for an http target")
	assert.Nil(t, claim.TLS)

	lab := byName(t, targets, "LAB")
	require.NotNil(t, lab.TLS)
	assert.True(t, lab.TLS.InsecureSkipVerify)
	assert.Empty(t, lab.TLS.Certificates)

	_, err = relay.New(relay.Config{Targets: targets})
	assert.ErrorContains(t, err, "AllowedClients need TLS with ClientCAs", "the hub still insists on mutual TLS")
}

func TestLoadRefusesBadTLSSettings(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "CA")
	caFile := ca.WriteFile(t, dir, "ca")
	cert, key := ca.Client(t, "relayhub").WriteFiles(t, dir, "relayhub")
	https := "[CORE]\nurl = \"https://core.internal\"\n"
	tests := []struct {
		name, body, key, want string
	}{
		{"TLS for an http target", "[CORE]\nca_file = \"" + caFile + "\"\n", "ca_file", `TLS settings need an https:// url, and CORE's is "http://127.0.0.1:9201"`},
		{"server name for an http target", "[CORE]\nserver_name = \"core\"\n", "server_name", "need an https:// url"},
		{"certificate without key", https + "client_cert = \"" + cert + "\"\n", "client_key", "missing: client_cert needs its key"},
		{"key without certificate", https + "client_key = \"" + key + "\"\n", "client_cert", "missing: client_key needs its certificate"},
		{"missing CA file", https + "ca_file = \"nope.pem\"\n", "ca_file", filepath.Join(dir, "nope.pem")},
		{"CA file without certificates", https + "ca_file = \"" + key + "\"\n", "ca_file", "PRIVATE KEY block"},
		{"certificate and key that do not match", https + "client_cert = \"" + cert + "\"\nclient_key = \"" + caFile + "\"\n", "client_cert", cert},
		{"empty path", https + "ca_file = \"\"\n", "ca_file", "must not be empty"},
		{"skip verify as a string", https + "insecure_skip_verify = \"yes\"\n", "insecure_skip_verify", `want true or false, got "yes"`},
		{"no patterns", "[CORE]\nallowed_clients = []\n", "allowed_clients", "name at least one client pattern"},
		{"a pattern as a string", "[CORE]\nallowed_clients = \"branch-*\"\n", "allowed_clients", "want an array of client patterns"},
		{"an empty pattern", "[CORE]\nallowed_clients = [\"a\", \"\"]\n", "allowed_clients", "must not be empty"},
		{"a pattern with a control character", "[CORE]\nallowed_clients = [\"a\\tb\"]\n", "allowed_clients", "control character"},
		{"a misspelt key", "[CORE]\nallowed_client = [\"a\"]\n", "allowed_client", "did you mean allowed_clients?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "relay.toml")
			require.NoError(t, os.WriteFile(path, []byte(tt.body), 0o600))
			_, err := Load(path, flagDefaults, defaultPair)
			var ce *Error
			require.True(t, errors.As(err, &ce), "want a *Error, got %T: %v", err, err)
			assert.Equal(t, "CORE", ce.Table)
			assert.Equal(t, tt.key, ce.Key)
			assert.Contains(t, err.Error(), tt.want)
			assert.False(t, strings.Contains(err.Error(), "\n"), "one line")
		})
	}
}

// x509Roots verifies a server certificate against roots.
func x509Roots(roots *x509.CertPool) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: roots}
}
