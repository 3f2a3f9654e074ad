package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/certtest"
	"github.com/relayhub/relayhub/internal/logtest"
)

func TestTLSDefaultsAndEnvironment(t *testing.T) {
	c, err := parse(t, nil)
	require.NoError(t, err)
	assert.Empty(t, c.TLSCert, "plain TCP unless asked")
	assert.Equal(t, "1.2", c.TLSMinVersion)
	assert.Equal(t, duration(5*time.Second), c.TLSHandshakeTimeout)

	c, err = parse(t, []string{
		"RELAY_TLS_CERT=hub.crt", "RELAY_TLS_KEY=hub.key", "RELAY_TLS_CLIENT_CA=ca.pem",
		"RELAY_TLS_MIN_VERSION=1.3", "RELAY_TLS_HANDSHAKE_TIMEOUT=2", "RELAY_ADMIN_TLS_CERT=a.crt", "RELAY_ADMIN_TLS_KEY=a.key",
	})
	require.NoError(t, err)
	assert.Equal(t, TLSFlags{
		TLSCert: "hub.crt", TLSKey: "hub.key", TLSClientCA: "ca.pem", TLSMinVersion: "1.3",
		TLSHandshakeTimeout: duration(2 * time.Second), AdminTLSCert: "a.crt", AdminTLSKey: "a.key",
	}, c.TLSFlags)
}

func TestBadTLSFlagsNameTheirFlag(t *testing.T) {
	assertBadFlags(t, []badFlagCase{
		{name: "certificate without key", args: []string{"--tls-cert", "hub.crt"}, want: "--tls-cert and --tls-key: give both"},
		{name: "key without certificate", args: []string{"--tls-key", "hub.key"}, want: "--tls-cert and --tls-key: give both"},
		{name: "client CA without TLS", args: []string{"--tls-client-ca", "ca.pem"}, want: "--tls-client-ca: needs --tls-cert and --tls-key"},
		{name: "TLS 1.1", args: []string{"--tls-min-version", "1.1"}, want: "--tls-min-version"},
		{name: "zero handshake timeout", args: []string{"--tls-handshake-timeout", "0"}, want: "--tls-handshake-timeout: must be more than zero"},
		{name: "admin certificate without key", args: []string{"--admin-tls-cert", "a.crt"}, want: "--admin-tls-cert and --admin-tls-key"},
		{name: "admin TLS with the admin port off", args: []string{"--admin-listen", "", "--admin-tls-cert", "a.crt", "--admin-tls-key", "a.key"}, want: "--admin-tls-cert: the admin port is off"},
		{name: "admin on every interface without a token", args: []string{"--admin-listen", ":9280"}, want: `--admin-listen ":9280": beyond loopback the admin port needs --admin-token`},
		{name: "admin on 0.0.0.0 without a token", args: []string{"--admin-listen", "0.0.0.0:9280"}, want: "needs --admin-token"},
		{name: "admin on a LAN address without a token", args: []string{"--admin-listen", "10.0.0.5:9280"}, want: "needs --admin-token"},
		{name: "admin on a host name without a token", args: []string{"--admin-listen", "hub.internal:9280"}, want: "needs --admin-token"},
	})
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

func TestRunServesTLSAndRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "hub CA")
	cert, key := ca.Server(t).WriteFiles(t, dir, "hub")
	clientCA := ca.WriteFile(t, dir, "clients")
	logPath := filepath.Join(dir, "breaker.log")
	var logs logtest.Buffer
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--breaker-log", logPath,
		"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", clientCA, "--admin-tls-cert", cert, "--admin-tls-key", key)
	require.NoError(t, err)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, c, zerolog.New(&logs), func(a, admin string) { addrs <- [2]string{a, admin} })
	}()
	bound := <-addrs

	// The client port speaks mutual TLS,
	nc, err := tls.Dial("tcp", bound[0], ca.ClientConfig(ca.Client(t, "branch-1")))
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(nc, "T1|NONE|x\n")
	require.NoError(t, err)
	got, err := bufio.NewReader(nc).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "T1|E903|unknown target\n", got)
	// and the admin port HTTPS.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: ca.ClientConfig(nil)}}
	resp, err := client.Get("https://" + bound[1] + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, logs.String(), `"message":"tls on"`)
	assert.Contains(t, logs.String(), `"port":"client"`)
	assert.Contains(t, logs.String(), `"port":"admin"`)
	stop()
	require.NoError(t, <-done)

	// Files that cannot be used stop the relay before it touches any file:
	// a usage error, naming the flag.
	garbage := filepath.Join(dir, "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not PEM"), 0o600))
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"missing certificate", []string{"--tls-cert", filepath.Join(dir, "nope.crt"), "--tls-key", key}, "--tls-cert, --tls-key, --tls-client-ca: certificate: open "},
		{"certificate of another key", []string{"--tls-cert", cert, "--tls-key", garbage}, "--tls-cert, --tls-key, --tls-client-ca: certificate"},
		{"client CA without certificates", []string{"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", garbage}, "no PEM certificate"},
		{"admin key missing", []string{"--admin-listen", "127.0.0.1:0", "--admin-tls-cert", cert, "--admin-tls-key", filepath.Join(dir, "nope.key")}, "--admin-tls-cert, --admin-tls-key: key: open "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fresh := filepath.Join(t.TempDir(), "breaker.log")
			c, err := parse(t, nil, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--breaker-log", fresh}, tt.args...)...)
			require.NoError(t, err)
			err = run(context.Background(), c, zerolog.Nop(), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, exitUsage, exitStatus(err))
			assert.NoFileExists(t, fresh, "the configuration is checked before any file is opened")
		})
	}
}

func TestAllowedClientsNeedTheClientCA(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "hub CA")
	cert, key := ca.Server(t).WriteFiles(t, dir, "hub")
	config := filepath.Join(dir, "relay.toml")
	require.NoError(t, os.WriteFile(config, []byte("[CORE]\nallowed_clients = [\"branch-*\"]\n"), 0o600))

	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-listen", "", "--breaker-log", filepath.Join(dir, "b.log"),
		"--config", config, "--tls-cert", cert, "--tls-key", key)
	require.NoError(t, err)
	err = run(context.Background(), c, zerolog.Nop(), nil)
	require.Error(t, err)
	assert.Equal(t, "config "+config+": [CORE] allowed_clients: needs --tls-client-ca (mutual TLS): without a verified client certificate there is no identity to match", err.Error())
	assert.Equal(t, exitUsage, exitStatus(err))
}

func TestBeyondLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9280": false, "127.1.2.3:1": false, "[::1]:9280": false, "localhost:9280": false,
		":9280": true, "0.0.0.0:9280": true, "[::]:9280": true, "10.0.0.5:9280": true, "hub.internal:9280": true, "nonsense": true,
	} {
		assert.Equal(t, want, beyondLoopback(addr), addr)
	}
}
