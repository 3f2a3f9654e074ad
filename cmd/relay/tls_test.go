package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/certtest"
)

func TestTLSDefaultsAndEnvironment(t *testing.T) {
	for _, tt := range []struct {
		env  []string
		want TLSFlags
	}{
		// Off by default: plain TCP on the client port, plain HTTP on the
		// admin port.
		{nil, TLSFlags{TLSMinVersion: "1.2", TLSHandshakeTimeout: duration(5 * time.Second)}},
		{[]string{
			"RELAY_TLS_CERT=hub.crt", "RELAY_TLS_KEY=hub.key", "RELAY_TLS_CLIENT_CA=ca.pem",
			"RELAY_TLS_MIN_VERSION=1.3", "RELAY_TLS_HANDSHAKE_TIMEOUT=2", "RELAY_ADMIN_TLS_CERT=a.crt", "RELAY_ADMIN_TLS_KEY=a.key",
		}, TLSFlags{
			TLSCert: "hub.crt", TLSKey: "hub.key", TLSClientCA: "ca.pem", TLSMinVersion: "1.3",
			TLSHandshakeTimeout: duration(2 * time.Second), AdminTLSCert: "a.crt", AdminTLSKey: "a.key",
		}},
	} {
		c, err := parse(t, tt.env)
		if assert.NoError(t, err, tt.env) {
			assert.Equal(t, tt.want, c.TLSFlags)
		}
	}
}

func TestBadTLSFlagsNameTheirFlag(t *testing.T) {
	// Each command line, split at spaces, and what its one line of error
	// says.
	for args, want := range map[string]string{
		"--tls-cert hub.crt":                                           "--tls-cert and --tls-key: give both",
		"--tls-key hub.key":                                            "--tls-cert and --tls-key: give both",
		"--tls-client-ca ca.pem":                                       "--tls-client-ca: needs --tls-cert and --tls-key",
		"--tls-min-version 1.1":                                        "--tls-min-version",
		"--tls-handshake-timeout 0":                                    "--tls-handshake-timeout: must be more than zero",
		"--admin-tls-cert a.crt":                                       "--admin-tls-cert and --admin-tls-key",
		"--admin-listen :9280":                                         `--admin-listen ":9280": beyond loopback the admin port needs --admin-token`,
		"--admin-listen 0.0.0.0:9280":                                  "needs --admin-token",
		"--admin-listen 10.0.0.5:9280":                                 "needs --admin-token",
		"--admin-listen hub.internal:9280":                             "needs --admin-token",
		"--admin-listen= --admin-tls-cert a.crt --admin-tls-key a.key": "--admin-tls-cert: the admin port is off",
	} {
		_, err := parse(t, nil, strings.Fields(args)...)
		if assert.Error(t, err, args) {
			assert.Contains(t, err.Error(), want, args)
		}
	}
}

func TestAdminBeyondLoopbackWithAToken(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:9280", "[::]:9280", ":9280"} {
		_, err := parse(t, []string{"RELAY_ADMIN_TOKEN=s3cret"}, "--admin-listen", listen)
		assert.NoError(t, err, listen)
	}
	for _, listen := range []string{"127.0.0.1:9280", "127.9.9.9:0", "[::1]:9280", "localhost:9280", "LOCALHOST:1"} {
		_, err := parse(t, nil, "--admin-listen", listen)
		assert.NoError(t, err, "%s is loopback: no token needed", listen)
	}
}

func TestRunRefusesTLSFilesItCannotUse(t *testing.T) {
	// Serving TLS is held to its contract with the real binary
	// (tls_integration_test.go); here, the files and settings that stop
	// the relay before it touches any file: a usage error, naming the flag
	// or the settings file's key.
	dir := t.TempDir()
	ca := certtest.NewCA(t, "hub CA")
	cert, key := ca.Server(t).WriteFiles(t, dir, "hub")
	garbage := filepath.Join(dir, "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not PEM"), 0o600))
	config := filepath.Join(dir, "relay.toml")
	require.NoError(t, os.WriteFile(config, []byte("[CORE]\nallowed_clients = [\"branch-*\"]\n"), 0o600))
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"missing certificate", []string{"--tls-cert", filepath.Join(dir, "nope.crt"), "--tls-key", key}, "--tls-cert, --tls-key, --tls-client-ca: certificate: open "},
		{"certificate of another key", []string{"--tls-cert", cert, "--tls-key", garbage}, "--tls-cert, --tls-key, --tls-client-ca: certificate"},
		{"client CA without certificates", []string{"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", garbage}, "no PEM certificate"},
		{"allowed clients without the client CA", []string{"--config", config, "--tls-cert", cert, "--tls-key", key},
			"config " + config + ": [CORE] allowed_clients: needs --tls-client-ca (mutual TLS): without a verified client certificate there is no identity to match"},
		{"admin key missing", []string{"--admin-listen", "127.0.0.1:0", "--admin-tls-cert", cert, "--admin-tls-key", filepath.Join(dir, "nope.key")}, "--admin-tls-cert, --admin-tls-key: key: open "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fresh := filepath.Join(t.TempDir(), "breaker.log")
			c, err := parse(t, nil, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--breaker-log", fresh, "--in-doubt-log", ""}, tt.args...)...)
			require.NoError(t, err)
			err = run(context.Background(), c, zerolog.Nop(), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, exitUsage, exitStatus(err))
			assert.NoFileExists(t, fresh, "the configuration is checked before any file is opened")
		})
	}
}

func TestBeyondLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9280": false, "127.1.2.3:1": false, "[::1]:9280": false, "localhost:9280": false,
		":9280": true, "0.0.0.0:9280": true, "[::]:9280": true, "10.0.0.5:9280": true, "hub.internal:9280": true, "nonsense": true,
	} {
		assert.Equal(t, want, beyondLoopback(addr), addr)
	}
}
