package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Sentinel is Redis as Sentinel keeps it available: a master, one
// replica started with --replicaof, and three sentinels
// (redis-server --sentinel) monitoring the master with a quorum of two,
// every process its own on a free loopback port, with nothing saved to
// disk but each sentinel's own configuration file, which it rewrites as it
// learns. The sentinels take a master silent for SentinelDownAfter for
// down and promote the replica a few seconds later.
//
// Everything listens on 127.0.0.1 and every address is an IP address, so
// the sentinels need neither resolve-hostnames nor announce-ip: each
// announces the loopback address it reaches the master from, and the
// master reports the replica by its loopback address and listening port.
//
// Typical use:
//
//	s := redistest.StartSentinel(t)
//	relay := proctest.Start(t, "./cmd/relay", "--state-store", s.URL(), ...)
//	old := s.KillMaster()          // kill -9 of the master
//	promoted := s.WaitFailover(old) // the sentinels now name the replica
//	s.Restart(old)                 // back, empty, as promoted's replica
const (
	// SentinelMasterName is the name the sentinels monitor the master by,
	// the URL's master_name.
	SentinelMasterName = "relayhub"
	// SentinelDownAfter is the sentinels' down-after-milliseconds: a
	// master that has not answered for this long is down for a sentinel,
	// and for the quorum about a second later.
	SentinelDownAfter = time.Second
	// SentinelFailoverTimeout is the sentinels' failover-timeout: how long
	// a failover may take before it is given up, and, twice over, how soon
	// another may start after one given up.
	SentinelFailoverTimeout = 3 * time.Second
	// SentinelTimeout bounds each wait of a Sentinel: its start, a
	// failover, a restarted server joining as a replica.
	SentinelTimeout = 30 * time.Second

	sentinelCount  = 3
	sentinelQuorum = 2
	// sentinelStall is how long a replica stalled by StallReplica stays
	// so at most: well under SentinelDownAfter, so that no sentinel takes
	// the stalled replica for down and refuses to promote it.
	sentinelStall = SentinelDownAfter / 2
)

// Sentinel is a running Sentinel deployment owned by one test, stopped
// when the test ends. Its methods belong on the goroutine of the test that
// started it, except URL, which is safe for concurrent use.
type Sentinel struct {
	t         testing.TB
	bin       string
	data      []*SentinelNode // the master and the replica, in the order started
	sentinels []*SentinelNode
	url       string
	// master is the server that is master as far as this Sentinel's own
	// steps know: the first, then each WaitFailover's.
	master *SentinelNode

	// stalled is the replica StallReplica stalled, until KillMaster; zero
	// stallEnd when none.
	stalled  *SentinelNode
	stallEnd time.Time
}

// SentinelNode is one process of a Sentinel: the master, the replica or a
// sentinel. Its Addr and Port are safe for concurrent use.
type SentinelNode struct {
	s        *Sentinel
	port     int
	dir      string
	sentinel bool

	process
}

// StartSentinel starts a master, its replica and three sentinels, and
// waits until the replica is in sync and every sentinel knows the master,
// the replica and the two other sentinels, so that a failover can be
// authorised. It fails the test when redis-server is not installed or the
// deployment does not come up. Every process is stopped when the test
// ends.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server; .ci/run installs it): %v", err)
	}
	s := &Sentinel{t: t, bin: bin}
	t.Cleanup(s.stopAll)
	master := s.newNode(false)
	s.master = master
	s.startFresh(master, nil)
	replica := s.newNode(false)
	s.startFresh(replica, master)
	for range sentinelCount {
		s.startFresh(s.newNode(true), master)
	}
	u := "redis://" + s.sentinels[0].Addr() + "?master_name=" + SentinelMasterName
	for _, n := range s.sentinels[1:] {
		u += "&addr=" + n.Addr()
	}
	s.url = u
	s.waitFor("the replica in sync and every sentinel ready", func() error {
		return s.ready(master, replica)
	})
	return s
}

// newNode returns a stopped node with its own directory, among those
// stopAll stops from now on.
func (s *Sentinel) newNode(sentinel bool) *SentinelNode {
	n := &SentinelNode{s: s, dir: s.t.TempDir(), sentinel: sentinel}
	if sentinel {
		s.sentinels = append(s.sentinels, n)
	} else {
		s.data = append(s.data, n)
	}
	return n
}

// startFresh starts n on a free port: a sentinel of master, a replica of
// master, or (master nil) a master. A port found free may be taken before
// redis-server binds it; it tries a few, each with a configuration of its
// own.
func (s *Sentinel) startFresh(n *SentinelNode, master *SentinelNode) {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		n.port = freePort(s.t)
		if err := os.RemoveAll(n.conf()); err != nil {
			s.t.Fatalf("redis sentinel: %v", err)
		}
		err := n.start(master)
		if err == nil {
			return
		}
		if attempt == 4 {
			s.t.Fatalf("redis sentinel: %v", err)
		}
	}
}

// URL returns the deployment's URL as --state-store takes it: the first
// sentinel as host, the master's name as master_name, the other sentinels
// as addr= seeds.
func (s *Sentinel) URL() string { return s.url }

// Nodes returns the master and the replica, in the order they were
// started; which is master now is Master's to say.
func (s *Sentinel) Nodes() []*SentinelNode { return slices.Clone(s.data) }

// Sentinels returns the three sentinels.
func (s *Sentinel) Sentinels() []*SentinelNode { return slices.Clone(s.sentinels) }

// Master returns the server the sentinels name as master (SENTINEL
// get-master-addr-by-name), asking each in turn until one answers.
func (s *Sentinel) Master() *SentinelNode {
	s.t.Helper()
	var errs []error
	for _, sn := range s.sentinels {
		m, err := sn.masterByName(context.Background())
		if err == nil {
			return m
		}
		errs = append(errs, err)
	}
	s.t.Fatalf("redis sentinel: no sentinel names the master: %v", errors.Join(errs...))
	return nil
}

// Replica returns the server that is not Master.
func (s *Sentinel) Replica() *SentinelNode {
	s.t.Helper()
	return s.other(s.Master())
}

// other returns the data server that is not n.
func (s *Sentinel) other(n *SentinelNode) *SentinelNode {
	if s.data[0] == n {
		return s.data[1]
	}
	return s.data[0]
}

// StallReplica makes the replica go on reading its master's stream but
// apply none of it (CLIENT PAUSE WRITE on the replica), as a replica
// lagging behind would, for at most half of SentinelDownAfter. What the
// master writes meanwhile reaches the replica only if the stall ends
// before the master dies: KillMaster, called soon after, makes sure it
// does not, so that a write acknowledged by the master is lost in the
// failover, as asynchronous replication may lose it.
func (s *Sentinel) StallReplica() {
	s.t.Helper()
	r := s.other(s.master)
	ms := strconv.FormatInt(sentinelStall.Milliseconds(), 10)
	if err := r.do(context.Background(), "CLIENT", "PAUSE", ms, "WRITE").Err(); err != nil {
		s.t.Fatalf("redis sentinel: stall the replica %s: %v", r, err)
	}
	s.stalled, s.stallEnd = r, time.Now().Add(sentinelStall)
}

// KillMaster kills the master with SIGKILL, by its pid, as kill -9
// would, waits until it is reaped, and returns it. It asks no sentinel
// first: the master is the first server, or the last WaitFailover's, so
// the kill follows what the test did before it at once. After
// StallReplica it also waits until the replica has seen its master go,
// which drops what the replica read but had not applied, and ends the
// stall; it fails the test when the stall ran out before that, since the
// replica may then have applied what it was meant to lose.
func (s *Sentinel) KillMaster() *SentinelNode {
	s.t.Helper()
	m := s.master
	if m.Pid() == 0 {
		s.t.Fatalf("redis sentinel: KillMaster: the master %s is not running (WaitFailover first)", m)
	}
	m.signal(syscall.SIGKILL, 0)
	if r := s.stalled; r != nil {
		s.stalled = nil
		s.waitFor("the stalled replica to see its master gone", func() error {
			info, err := r.info(context.Background())
			if err != nil {
				return err
			}
			if info["master_link_status"] != "down" {
				return fmt.Errorf("%s: master_link_status:%s", r, info["master_link_status"])
			}
			return nil
		})
		if time.Now().After(s.stallEnd) {
			s.t.Fatalf("redis sentinel: the replica's stall (%v) ran out before it saw its master killed", sentinelStall)
		}
		if err := r.do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
			s.t.Fatalf("redis sentinel: end the replica's stall: %v", err)
		}
	}
	return m
}

// WaitFailover waits until every sentinel names the server other than old
// as master and that server says it is one, and returns it.
func (s *Sentinel) WaitFailover(old *SentinelNode) *SentinelNode {
	s.t.Helper()
	promoted := s.other(old)
	s.waitFor("the sentinels to promote "+promoted.String(), func() error {
		ctx := context.Background()
		for _, sn := range s.sentinels {
			m, err := sn.masterByName(ctx)
			if err != nil {
				return err
			}
			if m != promoted {
				return fmt.Errorf("sentinel %s names %s", sn, m)
			}
		}
		info, err := promoted.info(ctx)
		if err != nil {
			return err
		}
		if info["role"] != "master" {
			return fmt.Errorf("%s: role:%s", promoted, info["role"])
		}
		return nil
	})
	s.master = promoted
	return promoted
}

// Restart starts a stopped server again on its port, empty, as a replica
// of the current master, as an operator bringing it back would, and waits
// until the two are in sync and every sentinel takes one for the master
// and the other for a replica that a failover may promote.
func (s *Sentinel) Restart(n *SentinelNode) {
	s.t.Helper()
	if n.sentinel {
		s.t.Fatalf("redis sentinel: Restart of sentinel %s", n)
	}
	if n.Pid() != 0 {
		s.t.Fatalf("redis sentinel: Restart of %s while running", n)
	}
	master := s.Master()
	// The old process's port may linger briefly in the kernel; retry.
	s.waitFor("restart "+n.String(), func() error { return n.start(master) })
	// On a loaded machine the sentinels may take the new master for down
	// and fail over once more, to the server just restarted: wait for the
	// pair to be ready whichever way round it ends.
	s.waitFor(n.String()+" to join as a replica", func() error {
		m := s.Master()
		if err := s.ready(m, s.other(m)); err != nil {
			return err
		}
		s.master = m
		return nil
	})
}

// ready reports why a failover of master to replica could not be
// authorised yet: the replica is not in sync, or a sentinel does not know
// them both, lacks the other sentinels, or takes one for down.
func (s *Sentinel) ready(master, replica *SentinelNode) error {
	ctx := context.Background()
	info, err := replica.info(ctx)
	if err != nil {
		return err
	}
	if info["role"] != "slave" || info["master_port"] != strconv.Itoa(master.port) || info["master_link_status"] != "up" {
		return fmt.Errorf("%s: role:%s master_port:%s master_link_status:%s", replica, info["role"], info["master_port"], info["master_link_status"])
	}
	for _, sn := range s.sentinels {
		v, err := sn.do(ctx, "SENTINEL", "MASTER", SentinelMasterName).Slice()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", sn, err)
		}
		m := sentinelFields(v)
		if m["port"] != strconv.Itoa(master.port) || m["flags"] != "master" ||
			m["num-other-sentinels"] != strconv.Itoa(sentinelCount-1) {
			return fmt.Errorf("sentinel %s: master port %s flags %s, %s other sentinels", sn, m["port"], m["flags"], m["num-other-sentinels"])
		}
		replicas, err := sn.do(ctx, "SENTINEL", "REPLICAS", SentinelMasterName).Slice()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", sn, err)
		}
		found := false
		for _, r := range replicas {
			fields := sentinelFields(r)
			if fields["port"] == strconv.Itoa(replica.port) && fields["flags"] == "slave" && fields["master-link-status"] == "ok" {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("sentinel %s: %s is not a healthy replica yet", sn, replica)
		}
		if err := sn.do(ctx, "SENTINEL", "CKQUORUM", SentinelMasterName).Err(); err != nil {
			return fmt.Errorf("sentinel %s: %w", sn, err)
		}
	}
	return nil
}

// sentinelFields reads what SENTINEL MASTER returns, or one entry of
// SENTINEL REPLICAS: a flat list of names and values.
func sentinelFields(v any) map[string]string {
	out := map[string]string{}
	a, _ := v.([]any)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		val, _ := a[i+1].(string)
		out[k] = val
	}
	return out
}

// waitFor polls cond until it reports nil, failing the test with its last
// error after SentinelTimeout.
func (s *Sentinel) waitFor(what string, cond func() error) {
	s.t.Helper()
	deadline := time.Now().Add(SentinelTimeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis sentinel: waited %v for %s: %v\n%s", SentinelTimeout, what, err, s.outputs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outputs is what every process printed, for a failure's message.
func (s *Sentinel) outputs() string {
	var b strings.Builder
	for _, n := range append(slices.Clone(s.data), s.sentinels...) {
		fmt.Fprintf(&b, "--- %s (%s):\n%s", n, n.role(), n.Output())
	}
	return b.String()
}

// stopAll stops every process with SIGTERM, then SIGKILL after
// StopTimeout.
func (s *Sentinel) stopAll() {
	var wg sync.WaitGroup
	for _, n := range append(slices.Clone(s.data), s.sentinels...) {
		wg.Go(func() { n.signal(syscall.SIGTERM, StopTimeout) })
	}
	wg.Wait()
}

// Addr returns the node's address, 127.0.0.1:PORT; it stays the same
// across a restart.
func (n *SentinelNode) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// Port returns the node's port.
func (n *SentinelNode) Port() int { return n.port }

// String returns the node's address.
func (n *SentinelNode) String() string { return n.Addr() }

// role names the kind of node, for messages.
func (n *SentinelNode) role() string {
	if n.sentinel {
		return "sentinel"
	}
	return "redis-server"
}

// Pid returns the running node's process id, or 0 while it is stopped.
func (n *SentinelNode) Pid() int { return n.pid() }

// Output returns what the node's running (or last) process printed.
func (n *SentinelNode) Output() string { return n.output() }

// Client returns a client of this one server (not through the
// sentinels), closed when the test ends.
func (n *SentinelNode) Client() *redis.Client {
	c := redis.NewClient(n.options())
	n.s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// options are those of a client of this one server that fails fast.
func (n *SentinelNode) options() *redis.Options {
	return &redis.Options{
		Addr: n.Addr(), Protocol: 2, DisableIdentity: true, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	}
}

// do runs one command on the node, on a fresh connection bounded by a
// second and by ctx.
func (n *SentinelNode) do(ctx context.Context, args ...any) *redis.Cmd {
	c := redis.NewClient(n.options())
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return c.Do(ctx, args...)
}

// info returns the fields of the server's INFO replication.
func (n *SentinelNode) info(ctx context.Context) (map[string]string, error) {
	text, err := n.do(ctx, "INFO", "replication").Text()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out, nil
}

// masterByName asks the sentinel n which server is master, and returns
// that server.
func (n *SentinelNode) masterByName(ctx context.Context) (*SentinelNode, error) {
	addr, err := n.do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMasterName).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("sentinel %s: %w", n, err)
	}
	if len(addr) != 2 {
		return nil, fmt.Errorf("sentinel %s: master address %q", n, addr)
	}
	for _, d := range n.s.data {
		if addr[0] == "127.0.0.1" && addr[1] == strconv.Itoa(d.port) {
			return d, nil
		}
	}
	return nil, fmt.Errorf("sentinel %s names %s:%s, none of the deployment's servers", n, addr[0], addr[1])
}

// conf is the path of a sentinel's configuration file.
func (n *SentinelNode) conf() string { return filepath.Join(n.dir, "sentinel.conf") }

// start runs the node's process on n.port and waits until it answers
// PING: a sentinel of master, a replica of master, or (master nil) a
// master. A sentinel's configuration file is written on its first start
// only: the sentinel rewrites it with what it learns.
func (n *SentinelNode) start(master *SentinelNode) error {
	var args []string
	if n.sentinel {
		conf := n.conf()
		if _, err := os.Stat(conf); errors.Is(err, os.ErrNotExist) {
			text := strings.Join([]string{
				"port " + strconv.Itoa(n.port),
				"bind 127.0.0.1",
				"daemonize no",
				"dir " + n.dir,
				"loglevel notice",
				fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", SentinelMasterName, master.port, sentinelQuorum),
				fmt.Sprintf("sentinel down-after-milliseconds %s %d", SentinelMasterName, SentinelDownAfter.Milliseconds()),
				fmt.Sprintf("sentinel failover-timeout %s %d", SentinelMasterName, SentinelFailoverTimeout.Milliseconds()),
				fmt.Sprintf("sentinel parallel-syncs %s 1", SentinelMasterName),
				"",
			}, "\n")
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return err
			}
		}
		args = []string{conf, "--sentinel"}
	} else {
		args = []string{
			"--port", strconv.Itoa(n.port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", n.dir,
			// A replica syncs at once, not after the default 5 s of
			// waiting for others to share the transfer with.
			"--repl-diskless-sync-delay", "0",
			"--daemonize", "no", "--loglevel", "notice",
		}
		if master != nil {
			args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
		}
	}
	if err := n.run(n.Addr(), n.s.bin, args...); err != nil {
		return fmt.Errorf("%s: %w", n.role(), err)
	}
	return nil
}

// signal sends sig to the running node and waits for it to end; after
// grace (when above zero) it kills it.
func (n *SentinelNode) signal(sig syscall.Signal, grace time.Duration) {
	if err := n.process.signal(sig, grace); err != nil {
		n.s.t.Errorf("redis sentinel: %s %s: signal %v: %v", n.role(), n, sig, err)
	}
}
