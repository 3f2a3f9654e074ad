package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/envcheck"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

// parse parses args (and env, as KEY=VALUE pairs) into a cli as main does.
func parse(t *testing.T, env []string, args ...string) (*cli, error) {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	var c cli
	p, err := newParser(&c, kong.Exit(func(int) {}))
	require.NoError(t, err)
	_, err = p.Parse(args)
	return &c, err
}

func TestDefaults(t *testing.T) {
	c, err := parse(t, nil)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9200", c.Listen)
	assert.Equal(t, "127.0.0.1:9280", c.AdminListen)
	assert.Equal(t, []targetFlag{{Name: "CORE", URL: "http://127.0.0.1:9201"}, {Name: "CLAIM", URL: "http://127.0.0.1:9202"}}, c.Target)
	assert.Equal(t, 5, c.FailThreshold)
	assert.Equal(t, duration(10*time.Second), c.ResetTimeout)
	assert.Equal(t, 10, c.MaxInflight)
	assert.Equal(t, duration(3*time.Second), c.TargetTimeout)
	assert.Equal(t, duration(4*time.Second), c.TargetIdleTimeout)
	assert.Equal(t, "breaker.log", c.BreakerLog)
	assert.Equal(t, "in-doubt.log", c.InDoubtLog, "calls in doubt are journalled unless turned off")
	assert.False(t, c.BreakerLogSync, "no fsync per breaker log line unless asked")
	assert.Equal(t, []string{"E500", "E901", "E902"}, c.FailureCodes)
	assert.Equal(t, 16384, c.MaxLineBytes)
	assert.Equal(t, 10000, c.MaxConns)
	assert.Equal(t, duration(5*time.Minute), c.IdleTimeout)
	assert.Equal(t, duration(10*time.Second), c.DrainTimeout)
	assert.Equal(t, "info", c.LogLevel)
	assert.Equal(t, "json", c.LogFormat)
	assert.Equal(t, "", c.AccessLog, "no access log unless asked")
	assert.Equal(t, "", c.StateStore, "a hub on its own unless asked")
	assert.Equal(t, "", c.HubID)
}

func TestFleetFlags(t *testing.T) {
	c, err := parse(t, []string{"RELAY_STATE_STORE=rediss://u:p@redis.bank:6380/1", "RELAY_HUB_ID=hub-a"})
	require.NoError(t, err)
	assert.Equal(t, "rediss://u:p@redis.bank:6380/1", c.StateStore)
	assert.Equal(t, "hub-a", c.HubID)

	c, err = parse(t, nil, "--state-store", "redis://127.0.0.1:6379?master_name=relay", "--hub-id", "dc1.hub-2:9200")
	require.NoError(t, err)
	assert.Equal(t, "dc1.hub-2:9200", c.HubID)

	id := defaultHubID(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9200})
	assert.True(t, strings.HasSuffix(id, ":9200"), id)
	assert.LessOrEqual(t, len(id), 64)
	assert.Equal(t, "redis://u:xxxxx@h:1/0", redactURL("redis://u:secret@h:1/0"))
}

func TestTargetsReplaceDefaults(t *testing.T) {
	c, err := parse(t, nil, "--target", "pay=http://127.0.0.1:1", "--target", "CORE=https://core.bank:8443/api")
	require.NoError(t, err)
	assert.Equal(t, []targetFlag{{Name: "pay", URL: "http://127.0.0.1:1"}, {Name: "CORE", URL: "https://core.bank:8443/api"}}, c.Target)

	c, err = parse(t, []string{"RELAY_TARGET=A=http://127.0.0.1:1,B=http://127.0.0.1:2"})
	require.NoError(t, err)
	assert.Equal(t, []targetFlag{{Name: "A", URL: "http://127.0.0.1:1"}, {Name: "B", URL: "http://127.0.0.1:2"}}, c.Target)
}

func TestEnvironment(t *testing.T) {
	c, err := parse(t, []string{
		"RELAY_LISTEN=127.0.0.1:7000", "RELAY_FAIL_THRESHOLD=9", "RELAY_RESET_TIMEOUT=500ms",
		"RELAY_MAX_INFLIGHT=3", "RELAY_TARGET_TIMEOUT=2", "RELAY_BREAKER_LOG=/tmp/x.log",
		"RELAY_FAILURE_CODES=E500,E400", "RELAY_MAX_LINE_BYTES=100", "RELAY_MAX_CONNS=7",
		"RELAY_IDLE_TIMEOUT=1m", "RELAY_DRAIN_TIMEOUT=0.5", "RELAY_ADMIN_LISTEN=",
		"RELAY_WRITE_TIMEOUT=4s", "RELAY_LOG_LEVEL=debug", "RELAY_LOG_FORMAT=console",
		"RELAY_ACCESS_LOG=/tmp/access.log", "RELAY_BREAKER_LOG_SYNC=true", "RELAY_TARGET_IDLE_TIMEOUT=90s",
	})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7000", c.Listen)
	assert.Equal(t, "", c.AdminListen)
	assert.Equal(t, 9, c.FailThreshold)
	assert.Equal(t, duration(500*time.Millisecond), c.ResetTimeout)
	assert.Equal(t, 3, c.MaxInflight)
	assert.Equal(t, duration(2*time.Second), c.TargetTimeout)
	assert.Equal(t, duration(90*time.Second), c.TargetIdleTimeout)
	assert.Equal(t, "/tmp/x.log", c.BreakerLog)
	assert.True(t, c.BreakerLogSync)
	assert.Equal(t, []string{"E500", "E400"}, c.FailureCodes)
	assert.Equal(t, 100, c.MaxLineBytes)
	assert.Equal(t, 7, c.MaxConns)
	assert.Equal(t, duration(time.Minute), c.IdleTimeout)
	assert.Equal(t, duration(500*time.Millisecond), c.DrainTimeout)
	assert.Equal(t, duration(4*time.Second), c.WriteTimeout)
	assert.Equal(t, "debug", c.LogLevel)
	assert.Equal(t, "console", c.LogFormat)
	assert.Equal(t, "/tmp/access.log", c.AccessLog)
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{in: "10", want: 10 * time.Second},
		{in: "0.5", want: 500 * time.Millisecond},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "1m30s", want: 90 * time.Second},
		{in: "0", want: 0},
		{in: "-1", want: -time.Second},
		{in: "", bad: true},
		{in: "abc", bad: true},
		{in: "1.2.3", bad: true},
		{in: "10 s", bad: true},
		{in: "99999999999999999999", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseDuration(tt.in)
			if tt.bad {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// badFlagCase is a command line the relay must refuse, and what the one
// line of its error must say.
type badFlagCase struct {
	name string
	args []string
	want string
}

// assertBadFlags checks that each case is refused with one line naming what
// was wrong.
func assertBadFlags(t *testing.T, tests []badFlagCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, nil, tt.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "\n", "one line on stderr")
		})
	}
}

func TestBadValuesNameTheirFlag(t *testing.T) {
	tests := []badFlagCase{
		{name: "zero threshold", args: []string{"--fail-threshold", "0"}, want: "--fail-threshold: must be at least 1"},
		{name: "negative inflight", args: []string{"--max-inflight=-2"}, want: "--max-inflight: must be at least 1"},
		{name: "zero line", args: []string{"--max-line-bytes", "0"}, want: "--max-line-bytes"},
		{name: "zero conns", args: []string{"--max-conns", "0"}, want: "--max-conns"},
		{name: "zero reset", args: []string{"--reset-timeout", "0"}, want: "--reset-timeout: must be more than zero"},
		{name: "negative timeout", args: []string{"--target-timeout=-1s"}, want: "--target-timeout: must be more than zero"},
		{name: "negative target idle", args: []string{"--target-idle-timeout=-1s"}, want: "--target-idle-timeout: must be more than zero"},
		{name: "zero target idle", args: []string{"--target-idle-timeout", "0"}, want: "--target-idle-timeout: must be more than zero"},
		{name: "bad duration", args: []string{"--idle-timeout", "soon"}, want: "--idle-timeout: duration \"soon\""},
		{name: "zero drain", args: []string{"--drain-timeout", "0s"}, want: "--drain-timeout"},
		{name: "zero write", args: []string{"--write-timeout", "0"}, want: "--write-timeout"},
		{name: "target without url", args: []string{"--target", "CORE"}, want: "--target: \"CORE\": want NAME=URL"},
		{name: "target bad scheme", args: []string{"--target", "CORE=ftp://h"}, want: "--target: target CORE: URL \"ftp://h\""},
		{name: "target no host", args: []string{"--target", "CORE=http://"}, want: "--target: target CORE"},
		{name: "target bad name", args: []string{"--target", "CO RE=http://h"}, want: "--target: target name"},
		{name: "duplicate target", args: []string{"--target", "core=http://a", "--target", "CORE=http://b"}, want: "--target: CORE given twice"},
		{name: "bad failure code", args: []string{"--failure-codes", "E500,X1"}, want: "--failure-codes: failure code \"X1\""},
		{name: "failure code of a refusal", args: []string{"--failure-codes", "E905"}, want: "--failure-codes: failure code \"E905\""},
		{name: "failure code the hub reserves", args: []string{"--failure-codes", "E999"}, want: "--failure-codes: failure code \"E999\": E900 to E999 are the hub's own codes"},
		{name: "failure code E900", args: []string{"--failure-codes", "E500,E900"}, want: "--failure-codes: failure code \"E900\""},
		{name: "bad listen", args: []string{"--listen", "9200"}, want: "--listen \"9200\""},
		{name: "bad admin listen", args: []string{"--admin-listen", "x"}, want: "--admin-listen \"x\""},
		{name: "empty breaker log", args: []string{"--breaker-log", ""}, want: "--breaker-log"},
		{name: "blank access log", args: []string{"--access-log", " "}, want: "--access-log"},
		{name: "bad log format", args: []string{"--log-format", "xml"}, want: "--log-format"},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: "--log-level"},
		{name: "state store not redis", args: []string{"--state-store", "mysql://db:3306"}, want: "--state-store: state store URL \"mysql://db:3306\": want redis:// or rediss://"},
		{name: "state store without host", args: []string{"--state-store", "redis://:6379"}, want: "--state-store"},
		{name: "state store password never shown", args: []string{"--state-store", "redis://u:hunter2@h:6379/x"}, want: "u:xxxxx@h"},
		{name: "hub id with a space", args: []string{"--hub-id", "hub a"}, want: "--hub-id \"hub a\": want 1 to 64 of"},
		{name: "hub id with a bar", args: []string{"--hub-id", "a|b"}, want: "--hub-id"},
	}
	assertBadFlags(t, tests)
}

func TestFailureCodesAreRepeatableAndCommaSeparated(t *testing.T) {
	c, err := parse(t, nil, "--failure-codes", "E500", "--failure-codes", "E400,e901", "--failure-codes=E902")
	require.NoError(t, err)
	assert.Equal(t, []string{"E500", "E400", "e901", "E902"}, c.FailureCodes)

	c, err = parse(t, []string{"RELAY_FAILURE_CODES=E610,E500"})
	require.NoError(t, err)
	assert.Equal(t, []string{"E610", "E500"}, c.FailureCodes)

	// The flag wins over its variable.
	c, err = parse(t, []string{"RELAY_FAILURE_CODES=E610,E500"}, "--failure-codes", "E901")
	require.NoError(t, err)
	assert.Equal(t, []string{"E901"}, c.FailureCodes)
}

func TestHelpShowsTheFailureCodesDefaultAsItIs(t *testing.T) {
	var c cli
	var out bytes.Buffer
	p, err := newParser(&c, kong.Writers(&out, &out), kong.Exit(func(int) {}))
	require.NoError(t, err)
	_, _ = p.Parse([]string{"--help"})
	require.Contains(t, out.String(), "--failure-codes=")
	assert.Regexp(t, `--failure-codes=E500,E901,E902\s`, out.String(), "the default as it is, without a trailing ,...")
	assert.NotContains(t, out.String(), "E902,...")
}

func TestNegativeNumbersReachTheFlagsOwnCheck(t *testing.T) {
	// Given every flag that takes a number or a duration,
	var c cli
	p, err := newParser(&c)
	require.NoError(t, err)
	var numeric []string
	for _, f := range p.Model.Flags {
		switch f.Target.Interface().(type) {
		case int, float64, duration:
			numeric = append(numeric, f.Name)
		}
	}
	require.Subset(t, numeric, []string{"fail-threshold", "max-inflight", "target-timeout", "window", "failure-rate", "min-samples"})

	// a negative value, after a space or an equals sign, is refused by the
	// flag's own check, not taken for a short flag.
	for _, name := range numeric {
		for _, args := range [][]string{{"--" + name, "-1"}, {"--" + name + "=-1"}} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				_, err := parse(t, nil, args...)
				require.Error(t, err)
				assert.True(t, strings.HasPrefix(err.Error(), "--"+name+": must "), "want the flag's own check, got: %v", err)
			})
		}
	}

	assertBadFlags(t, []badFlagCase{
		{name: "negative threshold", args: []string{"--fail-threshold", "-1"}, want: "--fail-threshold: must be at least 1, got -1"},
		{name: "negative target timeout", args: []string{"--target-timeout", "-2s"}, want: "--target-timeout: must be more than zero, got -2s"},
		{name: "negative window", args: []string{"--window", "-1s"}, want: "--window: must not be negative, got -1s"},
		{name: "negative rate", args: []string{"--failure-rate", "-.5"}, want: "--failure-rate: must be from 0 (off) to 1, got -0.5"},
	})
}

func TestAFlagNeverTakesAnotherFlagAsItsValue(t *testing.T) {
	// Only a negative number is taken after a flag: anything else that
	// starts with a hyphen is a flag, so a flag given without its value is
	// refused rather than quietly set to the next flag or to nothing.
	assertBadFlags(t, []badFlagCase{
		{name: "string flag at the end", args: []string{"--admin-listen"}, want: "--admin-listen: expected string value"},
		{name: "string flag before a flag", args: []string{"--access-log", "--breaker-log-sync"}, want: "--access-log: expected string value"},
		{name: "number flag before a flag", args: []string{"--fail-threshold", "--max-inflight", "3"}, want: "--fail-threshold: expected int value"},
		{name: "duration flag before a flag", args: []string{"--window", "--slow-call", "1s"}, want: "--window: expected duration value"},
		{name: "number flag before a short flag", args: []string{"--max-conns", "-h"}, want: "--max-conns: expected int value"},
		{name: "string flag before a negative number", args: []string{"--listen", "-1"}, want: "--listen: expected string value"},
	})
}

func TestFailureCodesAcceptATargetsOwnCodes(t *testing.T) {
	c, err := parse(t, nil, "--failure-codes", "E400,E610,E899,E901,E902")
	require.NoError(t, err)
	assert.Equal(t, []string{"E400", "E610", "E899", "E901", "E902"}, c.FailureCodes)
}

// exitStatus returns the status the relay exits with for err, as kong's
// FatalIfErrorf picks it.
func exitStatus(err error) int {
	if ec := kong.ExitCoder(nil); errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

func TestParseErrorsAreUsageErrors(t *testing.T) {
	_, err := parse(t, nil, "--fail-threshold", "0")
	require.Error(t, err)
	assert.Equal(t, 80, exitStatus(err), "kong's own status, before main marks the error")
	assert.Equal(t, 2, exitStatus(usageError{err}))
	assert.Equal(t, err.Error(), usageError{err}.Error(), "the mark does not change the message")
}

func TestRunFailsOnBreakerLogItCannotOpen(t *testing.T) {
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--breaker-log", filepath.Join(t.TempDir(), "missing", "b.log"), "--in-doubt-log", "")
	require.NoError(t, err)
	err = run(context.Background(), c, zerolog.Nop(), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join("missing", "b.log"))
	assert.Equal(t, 1, exitStatus(err), "a runtime error")
}

func TestRunServesAndLogsTransitions(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(target.Close)
	logPath := filepath.Join(t.TempDir(), "breaker.log")
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-listen", "", "--target", "CORE="+target.URL,
		"--fail-threshold", "1", "--breaker-log", logPath, "--in-doubt-log", filepath.Join(filepath.Dir(logPath), "in-doubt.log"))
	require.NoError(t, err)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, c, zerolog.New(zerolog.NewTestWriter(t)), func(a, admin string) { addrs <- [2]string{a, admin} })
	}()
	bound := <-addrs
	addr := bound[0]
	assert.Empty(t, bound[1], "--admin-listen \"\" turns the admin port off")

	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	r := bufio.NewReader(nc)
	require.NoError(t, nc.SetDeadline(time.Now().Add(5*time.Second)))
	for _, rt := range []struct{ send, want string }{
		{"T1|core|x\n", "T1|E500|target failed: HTTP 500\n"},
		{"T2|CORE|x\n", "T2|E904|circuit open; retry after 10s\n"},
	} {
		_, err = io.WriteString(nc, rt.send)
		require.NoError(t, err)
		got, err := r.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, rt.want, got)
	}

	stop()
	require.NoError(t, <-done)
	data, err := os.ReadFile(logPath)
	require.NoError(t, err)
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\|CORE\|CLOSED->OPEN\n$`, string(data))
}

// httpGet returns the status and body of GET url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestRunServesAdminAndAccessLog(t *testing.T) {
	// Given a relay with its admin port and access log, and a target that
	// always fails,
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(target.Close)
	dir := t.TempDir()
	accessPath := filepath.Join(dir, "access.log")
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--target", "CORE="+target.URL,
		"--fail-threshold", "1", "--breaker-log", filepath.Join(dir, "breaker.log"), "--in-doubt-log", filepath.Join(dir, "in-doubt.log"), "--access-log", accessPath)
	require.NoError(t, err)
	var logs logtest.Buffer
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, c, zerolog.New(&logs), func(a, admin string) { addrs <- [2]string{a, admin} })
	}()
	bound := <-addrs
	admin := "http://" + bound[1]

	// its start-up line names both addresses,
	start := logs.Lines(t)[0]
	assert.Equal(t, "relay listening", start["message"])
	assert.Equal(t, bound[0], start["addr"])
	assert.Equal(t, bound[1], start["admin_addr"])
	assert.Equal(t, accessPath, start["access_log"])

	// and when CORE trips,
	nc, err := net.Dial("tcp", bound[0])
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(5*time.Second)))
	r := bufio.NewReader(nc)
	for _, line := range []string{"T1|CORE|x\n", "T2|CORE|x\n"} {
		_, err = io.WriteString(nc, line)
		require.NoError(t, err)
		_, err = r.ReadString('\n')
		require.NoError(t, err)
	}

	// then the admin port reports it,
	code, body := httpGet(t, admin+"/healthz")
	assert.Equal(t, http.StatusOK, code, body)
	code, body = httpGet(t, admin+"/readyz")
	assert.Equal(t, http.StatusOK, code, body)
	code, body = httpGet(t, admin+"/metrics")
	assert.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`relay_breaker_state{target="CORE"} 1`,
		`relay_requests_total{code="E904",target="CORE"} 1`,
		"\ngo_goroutines ",
		"\nprocess_open_fds ",
		`relay_build_info{goversion="`,
	} {
		assert.Contains(t, body, want)
	}
	code, body = httpGet(t, admin+"/status")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"state":"OPEN"`)

	// the relay logs the change at warn,
	var changes []map[string]any
	for _, l := range logs.Lines(t) {
		if l["message"] == "breaker state changed" {
			changes = append(changes, l)
		}
	}
	require.Len(t, changes, 1)
	assert.Equal(t, "warn", changes[0]["level"])
	assert.Equal(t, "OPEN", changes[0]["to"])

	// and once stopped, the access log holds both answers and the admin
	// port is closed.
	nc.Close()
	stop()
	require.NoError(t, <-done)
	data, err := os.ReadFile(accessPath)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 2)
	assert.Regexp(t, `"txid":"T1","target":"CORE","client":"127\.0\.0\.1:\d+","code":"E500"`, lines[0])
	assert.Regexp(t, `"txid":"T2","target":"CORE","client":"127\.0\.0\.1:\d+","code":"E904"`, lines[1])
	_, err = net.DialTimeout("tcp", bound[1], time.Second)
	assert.Error(t, err, "admin port still open after the relay stopped")
}

func TestRunFailsOnFilesAndAddressesItCannotUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { taken.Close() })
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "access log", args: []string{"--access-log", filepath.Join(dir, "missing", "a.log")}, want: "--access-log: open " + filepath.Join(dir, "missing", "a.log")},
		{name: "admin address taken", args: []string{"--admin-listen", taken.Addr().String()}, want: "--admin-listen: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--breaker-log", filepath.Join(t.TempDir(), "b.log"), "--in-doubt-log", ""}, tt.args...)
			c, err := parse(t, nil, args...)
			require.NoError(t, err)
			err = run(context.Background(), c, zerolog.Nop(), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, 1, exitStatus(err), "a runtime error")
		})
	}
}

func TestLogger(t *testing.T) {
	tests := []struct {
		name, level, format string
		want                string // a regexp the output must match
	}{
		{name: "json", level: "info", format: "json",
			want: `^\{"level":"info","target":"CORE","time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","message":"shown"\}\n$`},
		{name: "console", level: "info", format: "console", want: `^\d\d:\d\d:\d\d\.\d{3} INF shown target=CORE\n$`},
		{name: "level filters", level: "error", format: "json", want: `^$`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := newLogger(&buf, tt.level, tt.format)
			log.Debug().Msg("hidden")
			log.Info().Str("target", "CORE").Msg("shown")
			assert.Regexp(t, tt.want, buf.String())
		})
	}
}

func TestEveryRelayVariableTheProjectNamesIsAFlags(t *testing.T) {
	// The relay refuses a RELAY_ variable that is no flag's, so every one
	// the docs, the service files and the scripts name must be a flag's:
	// none of them may stop a relay started as they say.
	var c cli
	p, err := newParser(&c)
	require.NoError(t, err)
	known := envcheck.Known(p.Model)
	var files []string
	for _, pattern := range []string{"README.md", "Makefile", "docs/*", "deploy/*", "deploy/*/*", "scripts/*"} {
		matches, err := filepath.Glob(filepath.Join("..", "..", pattern))
		require.NoError(t, err)
		files = append(files, matches...)
	}
	require.NotEmpty(t, files)
	variable := regexp.MustCompile(`\bRELAY_[A-Z0-9_]*[A-Z0-9]\b`)
	for _, f := range files {
		text, err := os.ReadFile(f)
		if errors.Is(err, syscall.EISDIR) {
			continue
		}
		require.NoError(t, err)
		for _, name := range variable.FindAllString(string(text), -1) {
			assert.Contains(t, known, name, "%s names %s", f, name)
		}
	}
}

func TestAMisspeltVariableIsAUsageError(t *testing.T) {
	var c cli
	p, err := newParser(&c)
	require.NoError(t, err)
	err = envcheck.Check(p.Model, envPrefix, []string{"RELAY_TARGET_TIMEOUT=1s", "RELAY_FAIL_TRESHOLD=3", "RELAYHUB_BIN=bin"})
	require.EqualError(t, err, "environment: RELAY_FAIL_TRESHOLD: no such setting; did you mean RELAY_FAIL_THRESHOLD?")
	assert.Equal(t, 2, exitStatus(usageError{err}))
}
