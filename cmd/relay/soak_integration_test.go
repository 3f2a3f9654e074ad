//go:build soak

package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/internal/testutil/toxitest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// TestSoak is `make soak` (never `make test`): three hubs on a
// Sentinel-managed store, their targets and their clients behind
// toxiproxy, SOAK_DURATION (30m) of mixed paced load at SOAK_RATE lines a
// second with a fault toggled at random every few seconds, a failover every
// 5 minutes and one hub restarted in the middle. At the end no line is lost,
// doubled or malformed, every breaker log's chains hold, and each hub's RSS
// (quarters' medians) and goroutines (quarters' floors) are flat within
// 10 % over the last two thirds of the run.
func TestSoak(t *testing.T) {
	duration := soakEnvDuration(t, "SOAK_DURATION", 30*time.Minute)
	rate := soakEnvInt(t, "SOAK_RATE", 600)
	failoverEvery := soakEnvDuration(t, "SOAK_FAILOVER_EVERY", 5*time.Minute)
	const connsPerHub = 4

	store := redistest.StartSentinel(t)
	tox := toxitest.Start(t)
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	targetLinks := []*toxitest.Proxy{
		tox.Proxy(t, "core", strings.TrimPrefix(core.URL, "http://")),
		tox.Proxy(t, "claim", strings.TrimPrefix(claim.URL, "http://")),
	}
	dir := t.TempDir()
	hubs := make([]*soakHub, 3)
	for i := range hubs {
		h := &soakHub{id: fmt.Sprintf("soak-%c", 'a'+i), listen: soakFreeAddr(t), admin: soakFreeAddr(t), dir: dir}
		h.args = []string{
			"--state-store", store.URL(), "--hub-id", h.id,
			"--target", "CORE=http://" + targetLinks[0].Listen, "--target", "CLAIM=http://" + targetLinks[1].Listen,
			"--target-timeout", "500ms", "--fail-threshold", "5", "--reset-timeout", "2s", "--max-inflight", "64",
			// A short shield window, so that the memory it holds by design
			// (every TXID of a window) has filled long before the last
			// two thirds of the run, whose RSS must stay flat.
			"--in-doubt-log", filepath.Join(dir, h.id+"-in-doubt.log"), "--dedup", "--dedup-window", "2m",
		}
		h.start(t)
		h.clientLink = tox.Proxy(t, "client-"+h.id, h.listen)
		hubs[i] = h
	}

	ledger := newSoakLedger()
	load := &soakLoad{ledger: ledger, interval: time.Duration(float64(time.Second) * float64(3*connsPerHub) / float64(rate))}
	for _, h := range hubs {
		for c := range connsPerHub {
			load.add(t, h, c)
		}
	}

	began := time.Now()
	end := began.Add(duration)
	restartAt := began.Add(duration / 2)
	nextFailover := began.Add(failoverEvery)
	nextSample := began
	rng := rand.New(rand.NewPCG(uint64(began.UnixNano()), 1))
	faults, failovers, restarted := 0, 0, false
	var samples []soakSample
	for now := time.Now(); now.Before(end); now = time.Now() {
		if !now.Before(nextSample) {
			samples = append(samples, sampleHubs(t, hubs, now.Sub(began))...)
			nextSample = nextSample.Add(30 * time.Second)
		}
		if !now.Before(nextFailover) {
			old := store.KillMaster()
			store.WaitFailover(old)
			store.Restart(old)
			failovers++
			nextFailover = nextFailover.Add(failoverEvery)
		}
		if !restarted && !now.Before(restartAt) {
			h := hubs[1]
			load.pause(h)
			h.stop(t)
			h.start(t)
			load.resume(t, h)
			restarted = true
		}
		toggleFault(t, rng, targetLinks, hubs)
		faults++
		time.Sleep(time.Duration(2000+rng.IntN(3000)) * time.Millisecond)
	}
	for _, p := range targetLinks {
		clearFaults(p)
	}
	for _, h := range hubs {
		clearFaults(h.clientLink)
	}
	load.stopAll()

	// Every line answered exactly once, none malformed.
	sent, answered, missing, doubled, malformed, codes := ledger.totals()
	t.Logf("soak: %s, %d lines sent, %d answered, %d missing, %d doubled, %d malformed; codes %v; %d faults, %d failovers, hub %s restarted",
		time.Since(began).Round(time.Second), sent, answered, missing, doubled, malformed, codes, faults, failovers, hubs[1].id)
	assert.Zero(t, missing, "lines without an answer")
	assert.Zero(t, doubled, "lines answered twice")
	assert.Zero(t, malformed, "malformed answers")

	// Every breaker log's chains hold, run by run.
	for _, h := range hubs {
		for _, path := range h.breakerLogs {
			entries, _, err := breakerlog.ReadFile(path)
			require.NoError(t, err)
			assert.NoError(t, breakerlog.CheckChains(entries), path)
			t.Logf("soak: %s: %d breaker changes", filepath.Base(path), len(entries))
		}
	}

	// RSS and goroutines flat over the last two thirds of the run.
	logMemory(t, hubs, samples)
	from := duration / 3
	for _, h := range hubs {
		var rss, gor []float64
		for _, s := range samples {
			// The restarted hub from three minutes after its restart: its
			// 2-minute shield window has filled again by then.
			if s.hub == h.id && s.at >= from && (h.id != hubs[1].id || s.at >= duration/2+3*time.Minute) {
				rss = append(rss, float64(s.rssKiB))
				gor = append(gor, float64(s.goroutines))
			}
		}
		// RSS by its quarters' medians; goroutines by their quarters'
		// floors, the count at rest: how many there are at an instant
		// follows the calls in flight under the fault toggled then (up to
		// the bulkheads' 128), while a leak raises the floor.
		rf, rs := flatness(rss, "median", median)
		gf, gs := flatness(gor, "floor", slices.Min[[]float64])
		t.Logf("soak: %s: RSS %s KiB, goroutines %s", h.id, rs, gs)
		assert.LessOrEqual(t, rf, 0.10, "%s: RSS not flat: %s", h.id, rs)
		assert.LessOrEqual(t, gf, 0.10, "%s: goroutines not flat: %s", h.id, gs)
	}
}

// soakHub is one hub of the soak on fixed ports, so that its client link
// reaches it again after a restart.
type soakHub struct {
	id, listen, admin, dir string
	args                   []string
	clientLink             *toxitest.Proxy
	proc                   *proctest.Process
	breakerLogs            []string // one per run of the hub
	runs                   int
}

func (h *soakHub) start(t *testing.T) {
	t.Helper()
	h.runs++
	blog := filepath.Join(h.dir, fmt.Sprintf("%s-breaker-%d.log", h.id, h.runs))
	h.breakerLogs = append(h.breakerLogs, blog)
	h.proc = proctest.Start(t, relayPkg, append([]string{"--listen", h.listen, "--admin-listen", h.admin,
		"--breaker-log", blog, "--drain-timeout", "5s"}, h.args...)...)
}

func (h *soakHub) stop(t *testing.T) {
	t.Helper()
	h.proc.Signal(syscall.SIGTERM)
	require.Equal(t, 0, h.proc.Wait(), "%s stops cleanly", h.id)
}

// soakSample is one reading of a hub: its RSS and goroutines, and what
// its Go runtime and shield report on /metrics, so that the log tells what
// the RSS is made of.
type soakSample struct {
	hub        string
	at         time.Duration
	rssKiB     int
	goroutines int
	runtime    map[string]float64 // soakMetrics by name
}

// soakMetrics are the series of /metrics a soakSample keeps.
var soakMetrics = []string{
	"go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes",
	"go_memstats_stack_inuse_bytes", "relay_dedup_entries",
}

// readMetrics returns the soakMetrics of the hub's /metrics, summed over
// their labels; nil when the hub does not answer.
func readMetrics(h *soakHub) map[string]float64 {
	resp, err := adminClient.Get("http://" + h.admin + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := make(map[string]float64)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, rest, _ := strings.Cut(sc.Text(), " ")
		name, _, _ = strings.Cut(name, "{")
		if !slices.Contains(soakMetrics, name) {
			continue
		}
		if v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64); err == nil {
			out[name] += v
		}
	}
	return out
}

// logMemory logs every other reading of each hub (a minute apart):
// goroutines, RSS, the Go heap in use, the heap's free memory not yet
// handed back, stacks (all KiB), and the shield's entries.
func logMemory(t *testing.T, hubs []*soakHub, samples []soakSample) {
	t.Helper()
	kib := func(s soakSample, name string) int { return int(s.runtime[name] / 1024) }
	for _, h := range hubs {
		var b strings.Builder
		n := 0
		for _, s := range samples {
			if s.hub != h.id || s.runtime == nil {
				continue
			}
			if n++; n%2 == 0 {
				continue
			}
			fmt.Fprintf(&b, "\n  %5.1f min  goroutines %3d  rss %6d  heap %6d  free %6d  stacks %5d  shield %7.0f",
				s.at.Minutes(), s.goroutines, s.rssKiB, kib(s, "go_memstats_heap_inuse_bytes"),
				kib(s, "go_memstats_heap_idle_bytes")-kib(s, "go_memstats_heap_released_bytes"),
				kib(s, "go_memstats_stack_inuse_bytes"), s.runtime["relay_dedup_entries"])
		}
		t.Logf("soak: %s memory (KiB), a minute apart:%s", h.id, b.String())
	}
}

func sampleHubs(t *testing.T, hubs []*soakHub, at time.Duration) []soakSample {
	t.Helper()
	var out []soakSample
	for _, h := range hubs {
		s := soakSample{hub: h.id, at: at, rssKiB: rssKiB(t, h.proc.Pid()), runtime: readMetrics(h)}
		resp, err := adminClient.Get("http://" + h.admin + "/status")
		if err == nil {
			var st struct {
				Goroutines int `json:"goroutines"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			s.goroutines = st.Goroutines
		}
		out = append(out, s)
	}
	return out
}

// rssKiB is VmRSS of pid.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	return 0
}

// flatness compares the first quarter of vs with the last, each summed
// up by of (named stat): the growth over the span, as a share, and a
// summary.
func flatness(vs []float64, stat string, of func([]float64) float64) (float64, string) {
	if len(vs) < 4 {
		return 0, fmt.Sprintf("%d samples, too few to tell", len(vs))
	}
	q := len(vs) / 4
	first, last := of(vs[:q]), of(vs[len(vs)-q:])
	lo, hi := slices.Min(vs), slices.Max(vs)
	growth := (last - first) / first
	if growth < 0 {
		growth = -growth
	}
	summary := fmt.Sprintf("%s of the first quarter %.0f, of the last %.0f (%.1f %%), ", stat, first, last, 100*growth)
	if stat != "median" {
		summary += fmt.Sprintf("median of the first %.0f, of the last %.0f, ", median(vs[:q]), median(vs[len(vs)-q:]))
	}
	return growth, summary + fmt.Sprintf("min %.0f, max %.0f, %d samples", lo, hi, len(vs))
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	return s[len(s)/2]
}

// The faults toggled at random on a target's link: each replaces the one
// before; "" is none.
var targetFaults = []struct {
	name, typ string
	stream    toxitest.Stream
	attrs     toxitest.Attributes
}{
	{"", "", "", nil},
	{"", "", "", nil},
	{"slow", "latency", toxitest.Downstream, toxitest.Attributes{"latency": 800}},
	{"silent", "timeout", toxitest.Downstream, toxitest.Attributes{"timeout": 0}},
	{"reset", "reset_peer", toxitest.Downstream, toxitest.Attributes{"timeout": 50}},
	{"sliced", "slicer", toxitest.Downstream, toxitest.Attributes{"average_size": 8, "size_variation": 4, "delay": 100}},
	{"cut", "limit_data", toxitest.Downstream, toxitest.Attributes{"bytes": 60}},
}

// toggleFault replaces the fault of one target link, picked at random, and
// sometimes slices one hub's client link.
func toggleFault(t *testing.T, rng *rand.Rand, links []*toxitest.Proxy, hubs []*soakHub) {
	t.Helper()
	p := links[rng.IntN(len(links))]
	clearFaults(p)
	f := targetFaults[rng.IntN(len(targetFaults))]
	if f.name != "" {
		p.AddToxic(f.name, f.typ, f.stream, f.attrs)
		soakFaults.Store(p, f.name)
	}
	h := hubs[rng.IntN(len(hubs))]
	clearFaults(h.clientLink)
	if rng.IntN(3) == 0 {
		h.clientLink.AddToxic("sliced", "slicer", toxitest.Upstream, toxitest.Attributes{"average_size": 3, "size_variation": 2, "delay": 1})
		soakFaults.Store(h.clientLink, "sliced")
	}
}

// soakFaults is the toxic on each proxy, if any.
var soakFaults sync.Map

func clearFaults(p *toxitest.Proxy) {
	if name, ok := soakFaults.LoadAndDelete(p); ok {
		p.RemoveToxic(name.(string))
	}
}

// soakLedger counts, per TXID, the answers a line got.
type soakLedger struct {
	mu        sync.Mutex
	answers   map[string]int
	codes     map[string]int
	malformed int
}

func newSoakLedger() *soakLedger {
	return &soakLedger{answers: map[string]int{}, codes: map[string]int{}}
}

func (l *soakLedger) sent(txid string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[txid] += 0
}

func (l *soakLedger) answered(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, err := protocol.ParseResponse([]byte(line))
	if err != nil {
		l.malformed++
		return
	}
	l.answers[string(a.TxID)]++
	l.codes[string(a.Code)]++
}

// outstanding counts the lines among txids not answered yet.
func (l *soakLedger) outstanding(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id, c := range l.answers {
		if c == 0 && strings.HasPrefix(id, prefix) {
			n++
		}
	}
	return n
}

func (l *soakLedger) totals() (sent, answered, missing, doubled, malformed int, codes map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.answers {
		sent++
		switch {
		case c == 0:
			missing++
		case c > 1:
			doubled++
		}
		answered += c
	}
	return sent, answered, missing, doubled, l.malformed, l.codes
}

// soakLoad is the paced load: per hub a few connections through the hub's
// client link, each sending a line every interval, CORE and CLAIM in turn.
type soakLoad struct {
	ledger   *soakLedger
	interval time.Duration
	mu       sync.Mutex
	conns    map[string][]*soakConn // by hub
}

type soakConn struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

func (l *soakLoad) add(t *testing.T, h *soakHub, c int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		l.conns = map[string][]*soakConn{}
	}
	sc := &soakConn{stop: make(chan struct{})}
	prefix := fmt.Sprintf("%s-r%d-c%d-", h.id, h.runs, c)
	sc.wg.Go(func() { l.run(h.clientLink.Listen, prefix, c, sc.stop) })
	l.conns[h.id] = append(l.conns[h.id], sc)
}

// run sends lines on one connection until stop, then waits (up to 15 s)
// for its answers. A connection the hub or a fault closes is dialled
// again; its unanswered lines stay counted as missing.
func (l *soakLoad) run(addr, prefix string, c int, stop <-chan struct{}) {
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	seq := 0
	for {
		nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				continue
			}
		}
		readerDone := make(chan struct{})
		go func() {
			defer close(readerDone)
			r := bufio.NewReader(nc)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				l.ledger.answered(strings.TrimRight(line, "\n"))
			}
		}()
		broken := false
		for !broken {
			select {
			case <-stop:
				deadline := time.Now().Add(15 * time.Second)
				for l.ledger.outstanding(prefix) > 0 && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				nc.Close()
				<-readerDone
				return
			case <-readerDone:
				broken = true
				continue
			case <-tick.C:
			}
			seq++
			txid := fmt.Sprintf("%s%d", prefix, seq)
			target, payload := "CORE", fmt.Sprintf("BAL ACC%d", c)
			if seq%2 == 0 {
				target, payload = "CLAIM", "STATUS CLM-404"
			}
			l.ledger.sent(txid)
			if _, err := nc.Write([]byte(txid + "|" + target + "|" + payload + "\n")); err != nil {
				broken = true
			}
		}
		nc.Close()
		<-readerDone
	}
}

// pause stops h's connections, each once its lines are answered.
func (l *soakLoad) pause(h *soakHub) {
	l.mu.Lock()
	conns := l.conns[h.id]
	l.conns[h.id] = nil
	l.mu.Unlock()
	for _, sc := range conns {
		close(sc.stop)
	}
	for _, sc := range conns {
		sc.wg.Wait()
	}
}

// resume starts h's connections again.
func (l *soakLoad) resume(t *testing.T, h *soakHub) {
	t.Helper()
	for c := range 4 {
		l.add(t, h, c)
	}
}

func (l *soakLoad) stopAll() {
	l.mu.Lock()
	var all []*soakConn
	for _, cs := range l.conns {
		all = append(all, cs...)
	}
	l.conns = nil
	l.mu.Unlock()
	for _, sc := range all {
		close(sc.stop)
	}
	for _, sc := range all {
		sc.wg.Wait()
	}
}

// soakFreeAddr returns a loopback address free a moment ago.
func soakFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func soakEnvDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, name)
	return d
}

func soakEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, name)
	return n
}
