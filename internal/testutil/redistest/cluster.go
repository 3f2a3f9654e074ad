package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// Settings of the cluster's nodes and bounds of its waits.
const (
	// ClusterNodeTimeout is the nodes' cluster-node-timeout: a node
	// silent for this long is suspected, and its replica takes over about
	// a second after the other masters agree that it failed.
	ClusterNodeTimeout = time.Second
	// ClusterTimeout bounds each wait of a Cluster: its creation, a
	// failover, every node agreeing.
	ClusterTimeout = 30 * time.Second
	// busPortOffset is how far above a node's port its cluster bus
	// listens; no node port may be so high that its bus port is not one.
	busPortOffset = 10000
	maxNodePort   = 65535 - busPortOffset
	clusterSize   = 6
)

// Cluster is a running Redis Cluster owned by one test: three masters
// with one replica each, as
//
//	redis-cli --cluster create 127.0.0.1:P1 ... 127.0.0.1:P6 --cluster-replicas 1
//
// makes them, every node its own redis-server on a free loopback port
// below 55535 (its cluster bus listens 10000 above), with nothing saved
// to disk but the cluster's own configuration file, so that a node
// restarted after Kill comes back as the same node, empty, and rejoins.
// Nodes run with ClusterNodeTimeout, so that a replica takes over a dead
// master within a few seconds, and with cluster-require-full-coverage no,
// so that a shard with no node left stops only its own slots. Every node
// is stopped, by its pid, when the test ends.
//
// Typical use:
//
//	cl := redistest.StartCluster(t)
//	relay := proctest.Start(t, "./cmd/relay", "--state-store", cl.URL(), ...)
//	m := cl.MasterOfKey("rh:{CORE}:epoch")
//	cl.Kill(m)                     // kill -9
//	promoted := cl.WaitFailover(m) // its replica took over
//	cl.Restart(m)                  // back, as promoted's replica
//	cl.WaitOK()
//
// Its methods belong on the goroutine of the test that started it,
// except URL and the nodes' Addr, Port and ID, which are safe for
// concurrent use.
type Cluster struct {
	t     testing.TB
	bin   string
	nodes []*ClusterNode
}

// ClusterNode is one redis-server of a Cluster.
type ClusterNode struct {
	c    *Cluster
	port int
	dir  string
	id   string // the cluster's name for the node, kept across restarts

	process
}

// StartCluster starts six redis-servers in cluster mode, joins them with
// redis-cli --cluster create into three masters with a replica each, and
// waits until every node says cluster_state:ok, all agree on the layout
// and every replica has synced with its master (see WaitOK). It fails the
// test when redis-server or redis-cli is not installed or the cluster
// does not form. Every node is stopped when the test ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server; .ci/run installs it): %v", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is not installed (apt-get install redis-tools; .ci/run installs redis-server, which brings it): %v", err)
	}
	c := &Cluster{t: t, bin: bin}
	t.Cleanup(c.stopAll)
	taken := map[int]bool{}
	for i := range clusterSize {
		n := &ClusterNode{c: c, dir: filepath.Join(t.TempDir(), "node"+strconv.Itoa(i))}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			t.Fatalf("redis cluster: %v", err)
		}
		// A port found free may be taken before redis-server binds it;
		// try a few.
		for attempt := 0; ; attempt++ {
			n.port = freeNodePort(t, taken)
			err := n.start()
			if err == nil {
				break
			}
			if attempt == 4 {
				t.Fatalf("redis cluster node %d: %v", i, err)
			}
		}
		taken[n.port], taken[n.port+busPortOffset] = true, true
		c.nodes = append(c.nodes, n)
	}

	args := []string{"--cluster", "create"}
	for _, n := range c.nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), ClusterTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, n := range c.nodes {
		id, err := n.do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatalf("redis cluster: CLUSTER MYID on %s: %v", n.Addr(), err)
		}
		n.id = id
	}
	c.waitFor("three masters with a replica each", func() error {
		if err := c.agreed(); err != nil {
			return err
		}
		masters, replicas := 0, 0
		for _, v := range c.view() {
			switch {
			case v.isMaster() && len(v.slots) > 0:
				masters++
			case !v.isMaster() && c.byID(v.master) != nil:
				replicas++
			}
		}
		if masters != 3 || replicas != 3 {
			return fmt.Errorf("%d masters serving slots, %d replicas", masters, replicas)
		}
		return nil
	})
	return c
}

// freeNodePort returns a loopback port that was free a moment ago, as
// was the cluster bus port above it, and that is neither of a port in
// taken.
func freeNodePort(t testing.TB, taken map[int]bool) int {
	t.Helper()
	for range 200 {
		p := freePort(t)
		if p >= maxNodePort || taken[p] || taken[p+busPortOffset] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+busPortOffset))
		if err != nil {
			continue
		}
		_ = ln.Close()
		return p
	}
	t.Fatalf("redis cluster: no free port below %d with its bus port free", maxNodePort)
	return 0
}

// URL returns the cluster's URL as --state-store takes it: the first node
// as host, every other node as an addr= seed.
func (c *Cluster) URL() string {
	var b strings.Builder
	b.WriteString("redis://" + c.nodes[0].Addr())
	for i, n := range c.nodes[1:] {
		if i == 0 {
			b.WriteByte('?')
		} else {
			b.WriteByte('&')
		}
		b.WriteString("addr=" + n.Addr())
	}
	return b.String()
}

// Nodes returns the cluster's nodes, masters and replicas alike, in the
// order they were started.
func (c *Cluster) Nodes() []*ClusterNode { return slices.Clone(c.nodes) }

// Addr returns the node's address, 127.0.0.1:PORT. It stays the same
// across Kill and Restart.
func (n *ClusterNode) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// Port returns the node's port; its cluster bus listens 10000 above.
func (n *ClusterNode) Port() int { return n.port }

// ID returns the cluster's name for the node (CLUSTER MYID), which it
// keeps across restarts.
func (n *ClusterNode) ID() string { return n.id }

// String returns the node's address, for messages.
func (n *ClusterNode) String() string { return n.Addr() }

// Pid returns the running node's process id, or 0 while it is stopped.
func (n *ClusterNode) Pid() int { return n.pid() }

// start runs the node's redis-server and waits for it to answer PING.
func (n *ClusterNode) start() error {
	args := []string{
		"--port", strconv.Itoa(n.port), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
		"--cluster-node-timeout", strconv.FormatInt(ClusterNodeTimeout.Milliseconds(), 10),
		"--cluster-require-full-coverage", "no",
		// A replica syncs at once, not after the default 5 s of waiting
		// for others to share the transfer with.
		"--repl-diskless-sync-delay", "0",
		"--save", "", "--appendonly", "no", "--dir", n.dir,
		"--daemonize", "no", "--loglevel", "warning",
	}
	return n.run(n.Addr(), n.c.bin, args...)
}

// signal sends sig to the running node and waits for it to end; after
// grace (when above zero) it kills it.
func (n *ClusterNode) signal(sig syscall.Signal, grace time.Duration) {
	if err := n.process.signal(sig, grace); err != nil {
		n.c.t.Errorf("redis cluster node %s: signal %v: %v", n.Addr(), sig, err)
	}
}

// stopAll stops every node with SIGTERM, then SIGKILL after StopTimeout.
func (c *Cluster) stopAll() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() { n.signal(syscall.SIGTERM, StopTimeout) })
	}
	wg.Wait()
}

// Kill kills the node with SIGKILL, by its pid, as kill -9 would, and
// waits until it is reaped.
func (c *Cluster) Kill(n *ClusterNode) {
	c.t.Helper()
	if n.Pid() == 0 {
		c.t.Fatalf("redis cluster: Kill of %s, which is not running", n)
	}
	n.signal(syscall.SIGKILL, 0)
}

// Restart starts a killed node again on its port, with its cluster
// configuration file and an empty data set, as an operator bringing it
// back would, and waits until it answers PING. It rejoins the cluster on
// its own: a master whose replica took over comes back as that replica's
// replica. WaitOK waits for the whole cluster to agree again.
func (c *Cluster) Restart(n *ClusterNode) {
	c.t.Helper()
	if n.Pid() != 0 {
		c.t.Fatalf("redis cluster: Restart of %s while running", n)
	}
	// The old process's port may linger briefly in the kernel; retry.
	deadline := time.Now().Add(StartTimeout)
	for {
		err := n.start()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redis cluster: restart of %s: %v", n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// do runs one command on the node, with a fresh connection bounded by a
// second and by ctx.
func (n *ClusterNode) do(ctx context.Context, args ...any) *redis.Cmd {
	rdb := redis.NewClient(&redis.Options{
		Addr: n.Addr(), Protocol: 2, DisableIdentity: true, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return rdb.Do(ctx, args...)
}

// Client returns a go-redis client of the node alone (not of the
// cluster), closed when the test ends: for commands such as ROLE or
// CLUSTER INFO.
func (n *ClusterNode) Client() *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: n.Addr(), Protocol: 2, DisableIdentity: true})
	n.c.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Role returns the first field of the node's ROLE, "master" or "slave",
// or the error of a node that does not answer.
func (n *ClusterNode) Role() (string, error) {
	reply, err := n.do(context.Background(), "ROLE").Slice()
	if err != nil {
		return "", err
	}
	if len(reply) == 0 {
		return "", errors.New("empty ROLE reply")
	}
	role, _ := reply[0].(string)
	return role, nil
}

// nodeView is one line of CLUSTER NODES: one node as another sees it.
type nodeView struct {
	id     string
	port   int
	flags  []string
	master string // the id of the master of a replica; "-" for a master
	slots  []slotRange
}

// slotRange is a range of slots, both ends included.
type slotRange struct{ from, to int }

func (v nodeView) has(flag string) bool { return slices.Contains(v.flags, flag) }

func (v nodeView) isMaster() bool { return v.has("master") }

// failing reports that the viewer takes the node for failed, or suspects
// it.
func (v nodeView) failing() bool { return v.has("fail") || v.has("fail?") }

func (v nodeView) serves(slot int) bool {
	for _, r := range v.slots {
		if r.from <= slot && slot <= r.to {
			return true
		}
	}
	return false
}

// views returns the cluster as the node sees it: CLUSTER NODES, parsed.
func (n *ClusterNode) views() ([]nodeView, error) {
	text, err := n.do(context.Background(), "CLUSTER", "NODES").Text()
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(text)
}

// parseClusterNodes reads CLUSTER NODES: "ID IP:PORT@BUS[,HOST] FLAGS
// MASTER PING PONG EPOCH LINK SLOT...", one line per node; a slot is N,
// N-M, or a [N-<-ID] or [N->-ID] of a migration, which is skipped.
func parseClusterNodes(text string) ([]nodeView, error) {
	var out []nodeView
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		_, portText, _ := strings.Cut(addr, ":")
		port, err := strconv.Atoi(portText)
		if err != nil {
			return nil, fmt.Errorf("CLUSTER NODES line %q: %w", line, err)
		}
		v := nodeView{id: f[0], port: port, flags: strings.Split(f[2], ","), master: f[3]}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue
			}
			a, b, ok := strings.Cut(s, "-")
			from, err := strconv.Atoi(a)
			if err != nil {
				return nil, fmt.Errorf("CLUSTER NODES slot %q: %w", s, err)
			}
			to := from
			if ok {
				if to, err = strconv.Atoi(b); err != nil {
					return nil, fmt.Errorf("CLUSTER NODES slot %q: %w", s, err)
				}
			}
			v.slots = append(v.slots, slotRange{from, to})
		}
		out = append(out, v)
	}
	return out, nil
}

// running returns the nodes whose process runs.
func (c *Cluster) running() []*ClusterNode {
	var out []*ClusterNode
	for _, n := range c.nodes {
		if n.Pid() != 0 {
			out = append(out, n)
		}
	}
	return out
}

// byID returns the node the cluster calls id, nil when there is none.
func (c *Cluster) byID(id string) *ClusterNode {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// view returns the cluster as the first running node that answers sees
// it.
func (c *Cluster) view() []nodeView {
	c.t.Helper()
	var errs []error
	for _, n := range c.running() {
		v, err := n.views()
		if err == nil {
			return v
		}
		errs = append(errs, fmt.Errorf("%s: %w", n, err))
	}
	c.t.Fatalf("redis cluster: no running node answers CLUSTER NODES: %v", errors.Join(errs...))
	return nil
}

// KeySlot returns the hash slot of key, as CLUSTER KEYSLOT on a running
// node says.
func (c *Cluster) KeySlot(key string) int {
	c.t.Helper()
	for _, n := range c.running() {
		slot, err := n.do(context.Background(), "CLUSTER", "KEYSLOT", key).Int()
		if err == nil {
			return slot
		}
	}
	c.t.Fatalf("redis cluster: no running node answers CLUSTER KEYSLOT")
	return 0
}

// MasterOf returns the node that serves slot as its master, as the
// running nodes see it, dead or alive.
func (c *Cluster) MasterOf(slot int) *ClusterNode {
	c.t.Helper()
	for _, v := range c.view() {
		if v.isMaster() && v.serves(slot) {
			if n := c.byID(v.id); n != nil {
				return n
			}
		}
	}
	c.t.Fatalf("redis cluster: no master serves slot %d", slot)
	return nil
}

// MasterOfKey returns the master of key's slot (its hash tag's, when it
// has one: rh:{CORE}:open is CORE's).
func (c *Cluster) MasterOfKey(key string) *ClusterNode {
	c.t.Helper()
	return c.MasterOf(c.KeySlot(key))
}

// ReplicaOf returns master's replica, as the running nodes see it, dead
// or alive; the test fails when it has none.
func (c *Cluster) ReplicaOf(master *ClusterNode) *ClusterNode {
	c.t.Helper()
	for _, v := range c.view() {
		if v.master == master.id {
			if n := c.byID(v.id); n != nil {
				return n
			}
		}
	}
	c.t.Fatalf("redis cluster: %s has no replica", master)
	return nil
}

// Masters returns the nodes that serve slots as masters, as the running
// nodes see them, dead or alive, in the order of their first slot.
func (c *Cluster) Masters() []*ClusterNode {
	c.t.Helper()
	var vs []nodeView
	for _, v := range c.view() {
		if v.isMaster() && len(v.slots) > 0 {
			vs = append(vs, v)
		}
	}
	slices.SortFunc(vs, func(a, b nodeView) int { return a.slots[0].from - b.slots[0].from })
	var out []*ClusterNode
	for _, v := range vs {
		if n := c.byID(v.id); n != nil {
			out = append(out, n)
		}
	}
	return out
}

// WaitFailover waits until old's replica has taken over: it says it is a
// master (ROLE), and every running node names it master of old's slots.
// It returns the promoted node.
func (c *Cluster) WaitFailover(old *ClusterNode) *ClusterNode {
	c.t.Helper()
	replica := c.ReplicaOf(old)
	var slots []slotRange
	for _, v := range c.view() {
		if v.id == old.id {
			slots = v.slots
		}
	}
	if len(slots) == 0 {
		c.t.Fatalf("redis cluster: %s serves no slot", old)
	}
	c.waitFor("the failover of "+old.String()+" to "+replica.String(), func() error {
		if role, err := replica.Role(); err != nil || role != "master" {
			return fmt.Errorf("ROLE of %s: %q, %v", replica, role, err)
		}
		for _, n := range c.running() {
			vs, err := n.views()
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			for _, v := range vs {
				if v.id == replica.id && !(v.isMaster() && v.serves(slots[0].from)) {
					return fmt.Errorf("%s does not yet see %s as the master of slot %d", n, replica, slots[0].from)
				}
			}
		}
		return nil
	})
	return replica
}

// WaitOK waits until every running node says cluster_state:ok, takes no
// running node for failed, and sees the same master for every slot and
// the same replicas as the others, and until every running replica of a
// running master has its replication link up (a replica that never
// synced will not take over).
func (c *Cluster) WaitOK() {
	c.t.Helper()
	c.waitFor("every running node to agree and say cluster_state:ok", c.agreed)
}

// agreed reports why the running nodes are not yet of one mind, nil once
// they are.
func (c *Cluster) agreed() error {
	live := map[string]bool{}
	for _, n := range c.running() {
		live[n.id] = true
	}
	var first string
	for _, n := range c.running() {
		info, err := n.do(context.Background(), "CLUSTER", "INFO").Text()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", n, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: not cluster_state:ok", n)
		}
		vs, err := n.views()
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		var layout []string
		for _, v := range vs {
			if live[v.id] && v.failing() {
				return fmt.Errorf("%s takes running node %s for failed", n, v.id)
			}
			if v.id == n.id && !v.isMaster() && live[v.master] {
				// A replica that never synced would refuse to take
				// over: its data would be too old.
				repl, err := n.do(context.Background(), "INFO", "replication").Text()
				if err != nil {
					return fmt.Errorf("%s: INFO replication: %w", n, err)
				}
				if !strings.Contains(repl, "master_link_status:up") {
					return fmt.Errorf("%s: its link to its master is not up", n)
				}
			}
			if v.isMaster() {
				for _, r := range v.slots {
					layout = append(layout, fmt.Sprintf("%d-%d:%s", r.from, r.to, v.id))
				}
			} else {
				layout = append(layout, fmt.Sprintf("%s<%s", v.id, v.master))
			}
		}
		slices.Sort(layout)
		got := strings.Join(layout, " ")
		if first == "" {
			first = got
		} else if got != first {
			return fmt.Errorf("%s sees the cluster as %s, another as %s", n, got, first)
		}
	}
	return nil
}

// waitFor polls cond until it returns nil, failing the test with its last
// error after ClusterTimeout.
func (c *Cluster) waitFor(what string, cond func() error) {
	c.t.Helper()
	deadline := time.Now().Add(ClusterTimeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redis cluster: waited %v for %s: %v", ClusterTimeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
