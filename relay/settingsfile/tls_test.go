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

	"github.com/relayhub/relayhub/internal/testutil/certtest"
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
		{name: "TLS for an http target", body: "[CORE]\nca_file = \"" + caFile + "\"\n", key: "ca_file", want: `TLS settings need an https:// url, and CORE's is "http://127.0.0.1:9201"`},
		{name: "server name for an http target", body: "[CORE]\nserver_name = \"core\"\n", key: "server_name", want: "need an https:// url"},
		{name: "certificate without key", body: https + "client_cert = \"" + cert + "\"\n", key: "client_key", want: "missing: client_cert needs its key"},
		{name: "key without certificate", body: https + "client_key = \"" + key + "\"\n", key: "client_cert", want: "missing: client_key needs its certificate"},
		{name: "missing CA file", body: https + "ca_file = \"nope.pem\"\n", key: "ca_file", want: filepath.Join(dir, "nope.pem")},
		{name: "CA file without certificates", body: https + "ca_file = \"" + key + "\"\n", key: "ca_file", want: "PRIVATE KEY block"},
		{name: "certificate and key that do not match", body: https + "client_cert = \"" + cert + "\"\nclient_key = \"" + caFile + "\"\n", key: "client_cert", want: cert},
		{name: "empty path", body: https + "ca_file = \"\"\n", key: "ca_file", want: "must not be empty"},
		{name: "skip verify as a string", body: https + "insecure_skip_verify = \"yes\"\n", key: "insecure_skip_verify", want: `want true or false, got "yes"`},
		{name: "no patterns", body: "[CORE]\nallowed_clients = []\n", key: "allowed_clients", want: "name at least one client pattern"},
		{name: "a pattern as a string", body: "[CORE]\nallowed_clients = \"branch-*\"\n", key: "allowed_clients", want: "want an array of client patterns"},
		{name: "an empty pattern", body: "[CORE]\nallowed_clients = [\"a\", \"\"]\n", key: "allowed_clients", want: "must not be empty"},
		{name: "a pattern with a control character", body: "[CORE]\nallowed_clients = [\"a\\tb\"]\n", key: "allowed_clients", want: "control character"},
		{name: "a misspelt key", body: "[CORE]\nallowed_client = [\"a\"]\n", key: "allowed_client", want: "did you mean allowed_clients?"},
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
