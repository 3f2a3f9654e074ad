// Package toxitest runs Shopify's toxiproxy for a test: a real TCP proxy,
// its own process on a free loopback port, put between two of the
// project's processes (a client and the hub, the hub and a target) and
// driven through its HTTP API to add latency, stalls, resets, slices and
// cuts to what flows through it. It is stopped by its pid when the test
// ends.
//
// The server is built from the Go module proxy with go install, at the
// pinned Version, without entering the project's go.mod. The binary is
// kept under os.TempDir()/relayhub-proctest, beside proctest's builds, and
// a lock file makes test processes that need it at once share one
// install; later runs reuse it.
//
// Typical use:
//
//	srv := toxitest.Start(t)
//	core := proctest.StartFixture(t, "CORE", "core")
//	p := srv.Proxy(t, "core", strings.TrimPrefix(core.URL, "http://"))
//	relay := proctest.Start(t, "./cmd/relay", "--target", "CORE=http://"+p.Listen, ...)
//	p.AddToxic("slow", "latency", toxitest.Downstream, toxitest.Attributes{"latency": 2000})
//	...
//	p.RemoveToxic("slow")
//
// Integration tests are skipped in -short mode, as proctest's are.
package toxitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

// Version is the toxiproxy release the tests run.
const Version = "v2.5.0"

// ServerPkg is toxiproxy's server command; that release has no
// cmd/toxiproxy-server.
const ServerPkg = "github.com/Shopify/toxiproxy/v2/cmd/server"

// Timeouts of the harness. They bound every wait, so that a server that
// cannot be built or does not come up fails its test instead of hanging it.
const (
	// InstallTimeout bounds go install, downloads included.
	InstallTimeout = 5 * time.Minute
	// StartTimeout bounds the wait for a started server to answer its API.
	StartTimeout = 10 * time.Second
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	StopTimeout = 5 * time.Second
	// RequestTimeout bounds one call of the API.
	RequestTimeout = 10 * time.Second
)

// maxLoggedOutput caps how much of a failed test's server output is
// logged, keeping the end.
const maxLoggedOutput = 16 << 10

// install is this test process's look-up of the binary.
var install struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of the toxiproxy server, installing it on the
// first call of a test process (see the package comment). It skips the
// test in -short mode. It is safe for concurrent use.
func Binary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
	install.once.Do(func() { install.path, install.err = installServer() })
	if install.err != nil {
		t.Fatalf("toxiproxy %s: %v", Version, install.err)
	}
	return install.path
}

// installServer installs the server into its shared directory unless it is
// there already. The lock makes a second test process wait for the first's
// install rather than run its own into the same place; the binary is
// renamed into place whole, so no process ever runs half of one.
func installServer() (string, error) {
	dir := filepath.Join(os.TempDir(), "relayhub-proctest", "toxiproxy-"+Version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "toxiproxy-server")
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close() // and so unlocks
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin, nil
	}

	gobin, err := os.MkdirTemp(dir, "gobin-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(gobin)
	ctx, cancel := context.WithTimeout(context.Background(), InstallTimeout)
	defer cancel()
	pkg := ServerPkg + "@" + Version
	cmd := exec.CommandContext(ctx, goTool(), "install", pkg)
	// Outside any module and workspace, with no flags meant for the
	// project's build: pkg@version is built from its own go.mod.
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOWORK=off", "GOFLAGS=", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %w\n%s", pkg, err, out)
	}
	if err := os.Rename(filepath.Join(gobin, "server"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// goTool returns the go command; go test puts its own GOROOT/bin first in
// PATH, so the server is built by the toolchain running the tests.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

// apiClient makes every request to a server's API.
var apiClient = &http.Client{Timeout: RequestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

// Server is a running toxiproxy owned by one test. Stop and Reset belong on
// the goroutine of the test that started it; Addr and Pid are safe for
// concurrent use; each Proxy has its own test (see Proxy).
type Server struct {
	t    testing.TB
	addr string // the API's host:port
	cmd  *exec.Cmd
	out  *logtest.Buffer
	done chan struct{} // closed once the process has been reaped

	mu      sync.Mutex
	stopped bool // guarded by mu
}

// Start starts a toxiproxy server with its API on a free loopback port and
// waits until the API answers. The server is stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary(t)
	// A port found free may be taken before the server binds it: try a
	// few.
	for attempt := 0; ; attempt++ {
		s, err := start(t, bin)
		if err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		if attempt == 4 {
			t.Fatalf("toxiproxy: %v", err)
		}
	}
}

// start runs the server on a free port and waits for its API; a server
// that does not come up is stopped and reported.
func start(t testing.TB, bin string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{t: t, addr: net.JoinHostPort("127.0.0.1", port), out: &logtest.Buffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin, "-host", "127.0.0.1", "-port", port)
	// Its default level logs every chunk; info keeps one line per
	// connection, enough to read a failure by.
	s.cmd.Env = append(os.Environ(), "LOG_LEVEL=info")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	deadline := time.Now().Add(StartTimeout)
	for {
		if status, _, err := s.call(http.MethodGet, "/version", nil); err == nil && status == http.StatusOK {
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("exited before its API answered on %s:\n%s", s.addr, s.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("API on %s did not answer within %v:\n%s", s.addr, StartTimeout, s.out.String())
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// Addr returns the address of the server's API, 127.0.0.1:PORT.
func (s *Server) Addr() string { return s.addr }

// Pid returns the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop stops the server by its pid, SIGTERM then SIGKILL after
// StopTimeout, and waits until it is reaped; its proxies' connections
// close with it. Stopping a stopped server does nothing. When the test
// has failed, the server's output is logged.
func (s *Server) Stop() {
	s.mu.Lock()
	stopped := s.stopped
	s.stopped = true
	s.mu.Unlock()
	if stopped {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.t.Errorf("toxiproxy: SIGTERM: %v", err)
	}
	select {
	case <-s.done:
	case <-time.After(StopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if s.t.Failed() {
		out := s.out.String()
		if len(out) > maxLoggedOutput {
			out = "[...]" + out[len(out)-maxLoggedOutput:]
		}
		s.t.Logf("toxiproxy output:\n%s", out)
	}
}

// isStopped reports whether Stop has run.
func (s *Server) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// Reset enables every proxy and removes every toxic (POST /reset).
func (s *Server) Reset() {
	s.t.Helper()
	if err := s.do(http.MethodPost, "/reset", nil, nil); err != nil {
		s.t.Fatalf("toxiproxy: %v", err)
	}
}

// call sends one API request with body as JSON (none when nil) and returns
// the status and the answer's body.
func (s *Server) call(method, path string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+s.addr+path, r)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// do is call that wants a 2xx answer, decoded into out unless out is nil.
func (s *Server) do(method, path string, body, out any) error {
	status, b, err := s.call(method, path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if status/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: %w: %s", method, path, err, b)
		}
	}
	return nil
}

// Stream is the direction of the bytes a toxic works on.
type Stream string

// The two directions through a proxy.
const (
	// Upstream is what the proxy's client sends towards its upstream: the
	// requests.
	Upstream Stream = "upstream"
	// Downstream is what comes back from the upstream to the client: the
	// answers.
	Downstream Stream = "downstream"
)

// Attributes are a toxic's settings, as toxiproxy names them, e.g.
// {"latency": 2000} for a latency toxic, {"bytes": 100} for limit_data.
type Attributes map[string]any

// Proxy is one proxy of a Server: it listens on Listen and forwards every
// connection to Upstream through its toxics. Its methods fail the test
// that made it, and so belong on that test's goroutine.
type Proxy struct {
	// Name names the proxy in the API.
	Name string
	// Listen is the address clients connect to, 127.0.0.1:PORT.
	Listen string
	// Upstream is the address the proxy forwards to.
	Upstream string

	t testing.TB
	s *Server
}

// Proxy creates an enabled proxy to upstream (host:port) listening on a
// free loopback port, for test t (which may be a subtest of the server's),
// and removes it when t ends.
func (s *Server) Proxy(t testing.TB, name, upstream string) *Proxy {
	t.Helper()
	in := struct {
		Name     string `json:"name"`
		Listen   string `json:"listen"`
		Upstream string `json:"upstream"`
		Enabled  bool   `json:"enabled"`
	}{name, "127.0.0.1:0", upstream, true}
	var created struct {
		Listen string `json:"listen"`
	}
	if err := s.do(http.MethodPost, "/proxies", in, &created); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	p := &Proxy{Name: name, Listen: created.Listen, Upstream: upstream, t: t, s: s}
	t.Cleanup(func() {
		if !s.isStopped() {
			if err := s.do(http.MethodDelete, p.path(), nil, nil); err != nil {
				t.Errorf("toxiproxy: %v", err)
			}
		}
	})
	return p
}

// path returns the proxy's path in the API.
func (p *Proxy) path() string { return "/proxies/" + url.PathEscape(p.Name) }

// toxic is a toxic as the API takes it.
type toxic struct {
	Name       string     `json:"name"`
	Type       string     `json:"type"`
	Stream     Stream     `json:"stream"`
	Toxicity   float64    `json:"toxicity"`
	Attributes Attributes `json:"attributes,omitempty"`
}

// AddToxic adds a toxic of type typ ("latency", "timeout", "reset_peer",
// "slicer", "limit_data", ...) named name on stream, applied to every
// connection. A toxic works on the connections open when it is added as
// well as on new ones, except reset_peer: only a connection opened after it
// was added is closed with a TCP reset (toxiproxy sets SO_LINGER 0 when the
// connection starts); an older one gets a plain close.
func (p *Proxy) AddToxic(name, typ string, stream Stream, attrs Attributes) {
	p.t.Helper()
	p.addToxic(toxic{Name: name, Type: typ, Stream: stream, Toxicity: 1, Attributes: attrs})
}

// ResetOnClose makes every close toxiproxy makes of a connection opened
// from now on a TCP reset instead of a FIN: the close after limit_data's
// bytes, the close of a timeout toxic, Disable's. It adds a reset_peer
// toxic named "reset-on-close" that never fires (toxicity 0): toxiproxy
// sets SO_LINGER 0 on the connections of a proxy with a reset_peer toxic,
// fired or not. Remove it with RemoveToxic("reset-on-close").
func (p *Proxy) ResetOnClose() {
	p.t.Helper()
	p.addToxic(toxic{Name: "reset-on-close", Type: "reset_peer", Stream: Upstream, Toxicity: 0})
}

func (p *Proxy) addToxic(tx toxic) {
	p.t.Helper()
	if err := p.s.do(http.MethodPost, p.path()+"/toxics", tx, nil); err != nil {
		p.t.Fatalf("toxiproxy: proxy %s: %v", p.Name, err)
	}
}

// RemoveToxic removes the toxic named name; data flows freely again.
func (p *Proxy) RemoveToxic(name string) {
	p.t.Helper()
	if err := p.s.do(http.MethodDelete, p.path()+"/toxics/"+url.PathEscape(name), nil, nil); err != nil {
		p.t.Fatalf("toxiproxy: proxy %s: %v", p.Name, err)
	}
}

// Disable closes the proxy's connections and stops its listener: new
// connections are refused until Enable.
func (p *Proxy) Disable() {
	p.t.Helper()
	p.setEnabled(false)
}

// Enable listens again, on the same address.
func (p *Proxy) Enable() {
	p.t.Helper()
	p.setEnabled(true)
}

func (p *Proxy) setEnabled(on bool) {
	p.t.Helper()
	body := struct {
		Enabled bool `json:"enabled"`
	}{on}
	if err := p.s.do(http.MethodPost, p.path(), body, nil); err != nil {
		p.t.Fatalf("toxiproxy: proxy %s: %v", p.Name, err)
	}
}
