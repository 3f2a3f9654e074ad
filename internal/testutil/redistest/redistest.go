// Package redistest runs a real redis-server for a test: its own process on
// a free loopback port, with nothing saved to disk, stopped by its pid when
// the test ends. The fleet's tests use it so that what they check is what
// production runs against, never an imitation of Redis.
//
// redis-server must be on PATH (Debian's package redis-server; .ci/run
// installs it). When it is missing the test fails, with a message saying
// so: a fleet test that is skipped proves nothing.
//
// Typical use:
//
//	srv := redistest.Start(t)
//	relay := proctest.Start(t, "./cmd/relay", "--state-store", srv.URL(), ...)
//	srv.Kill()    // kill -9: the hubs must go on serving
//	srv.Restart() // the same port, empty
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Timeouts of the launcher, bounding every wait so that a redis-server that
// does not come up fails its test instead of hanging it.
const (
	// StartTimeout bounds the wait for a started server to answer PING.
	StartTimeout = 10 * time.Second
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	StopTimeout = 5 * time.Second
)

// Server is a running redis-server owned by one test. Its methods belong on
// the goroutine of the test that started it, except Addr and URL, which
// are safe for concurrent use.
type Server struct {
	t    testing.TB
	bin  string
	port int
	dir  string

	process
}

// Start starts redis-server on a free loopback port and waits until it
// answers PING. It fails the test when redis-server is not installed or
// does not come up. The server is killed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server; .ci/run installs it): %v", err)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.Stop)
	// A port found free may be taken before redis-server binds it; try a
	// few.
	for attempt := 0; ; attempt++ {
		s.port = freePort(t)
		err := s.start()
		if err == nil {
			return s
		}
		if attempt == 4 {
			t.Fatalf("redis-server: %v", err)
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// start runs redis-server on s.port and waits for it to answer PING.
func (s *Server) start() error {
	return s.run(s.Addr(), s.bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--loglevel", "warning")
}

// ping sends PING to addr and reports an error unless it answers +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Addr returns the server's address, 127.0.0.1:PORT. It stays the same
// across Kill and Restart.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL returns redis://127.0.0.1:PORT, as --state-store takes it.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Pid returns the running server's process id, or 0 while it is stopped.
func (s *Server) Pid() int { return s.pid() }

// Kill kills the server with SIGKILL, as kill -9 would, and waits until it
// is reaped. Clients see their connections reset and new ones refused.
func (s *Server) Kill() {
	s.t.Helper()
	s.signal(syscall.SIGKILL, 0)
}

// Stop stops the server with SIGTERM, then SIGKILL after StopTimeout, and
// waits until it is reaped. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.signal(syscall.SIGTERM, StopTimeout)
}

// signal sends sig to the running server and waits for it to end; after
// grace (when above zero) it kills it.
func (s *Server) signal(sig syscall.Signal, grace time.Duration) {
	if err := s.process.signal(sig, grace); err != nil {
		s.t.Errorf("redis-server: signal %v: %v", sig, err)
	}
}

// Restart starts a fresh, empty server on the same port after Kill or
// Stop, as an operator bringing Redis back would, and waits until it
// answers PING.
func (s *Server) Restart() {
	s.t.Helper()
	if s.Pid() != 0 {
		s.t.Fatalf("redis-server: Restart while running")
	}
	// The old process's port may linger briefly in the kernel; retry.
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	for {
		err := s.start()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("redis-server restart on port %d: %v", s.port, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
