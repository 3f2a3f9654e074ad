package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// capacityCut is one hub, static or adaptive, in front of its own CORE
// fixture, with the answers its clients got after the target's capacity
// was cut.
type capacityCut struct {
	core    *proctest.Fixture
	hub     *policyRelay
	inDoubt atomic.Int64 // E901 and E902 …; outcome unknown, after the cut
	booked  atomic.Int64 // 0000 after the cut
}

// startCapacityCut starts a CORE fixture with 16 workers of 40 ms and a
// hub in front of it with a ceiling of 16 and a 100 ms target timeout;
// extra are more relay flags. The breaker is set never to trip, so the
// bulkhead alone decides how many calls reach the target.
func startCapacityCut(t *testing.T, extra ...string) *capacityCut {
	t.Helper()
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"capacity":16,"service_ms":40}`)
	// No late reading: the fixture drops a queued call whose caller hung
	// up, which late reading would keep queued, so that its capacity goes
	// to the calls the hub still waits for, as the limits under test
	// assume.
	conf := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[CORE]\nlate_answer_grace = 0\n"), 0o600))
	args := append([]string{
		"--target", "CORE=" + core.URL,
		"--config", conf,
		"--max-inflight", "16",
		"--target-timeout", "100ms",
		"--fail-threshold", "1000000",
		"--in-doubt-log", "",
		"--drain-timeout", "1s",
	}, extra...)
	return &capacityCut{core: core, hub: startPolicyRelay(t, nil, args...)}
}

// drive keeps clients connections busy, one transaction at a time each,
// until stop is closed, counting the answers given once cut is set. A
// client refused E905 waits 5 ms before its next line, as a channel system
// backing off would.
func (c *capacityCut) drive(t *testing.T, clients int, cut *atomic.Bool, stop <-chan struct{}, wg *sync.WaitGroup) {
	for i := range clients {
		conn := hubtest.Dial(t, c.hub.Addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				a := conn.Exchange(fmt.Sprintf("C%dN%d|CORE|BAL ACC%d", i, n, i))
				if !cut.Load() {
					continue
				}
				switch {
				case a.Code == protocol.CodeOK:
					c.booked.Add(1)
				case strings.HasSuffix(a.Message, "; outcome unknown"):
					c.inDoubt.Add(1)
				case a.Code == protocol.CodeBulkheadFull:
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
}

func TestAdaptiveLimitFindsACutCapacityAndLeavesFewerCallsInDoubt(t *testing.T) {
	// Given two hubs in front of two equal targets, one with the static
	// limit of 16 and one adaptive under that ceiling, each driven by 24
	// clients.
	static := startCapacityCut(t)
	adaptive := startCapacityCut(t, "--adaptive-limit", "on")
	var cut atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	static.drive(t, 24, &cut, stop, &wg)
	adaptive.drive(t, 24, &cut, stop, &wg)
	defer func() { close(stop); wg.Wait() }()

	// While the targets are healthy the adaptive hub learns their
	// latency and uses its whole ceiling.
	proctest.Eventually(t, 10*time.Second, "the adaptive limit at its ceiling", func() bool {
		return statusOf(t, adaptive.hub.status(t), "CORE").Limit == 16
	})
	time.Sleep(time.Second) // a healthy second of baseline, past the first windows

	// When both targets lose three quarters of their capacity: 4 workers
	// serve 16 calls in 160 ms, past the 100 ms the hub waits.
	static.core.Ctl(t, `{"capacity":4}`)
	adaptive.core.Ctl(t, `{"capacity":4}`)
	cut.Store(true)
	time.Sleep(6 * time.Second)

	// Then the adaptive limit has settled below the ceiling, near what 4
	// workers serve within the timeout, and far fewer of its calls ended
	// in doubt than the static hub's.
	st := statusOf(t, adaptive.hub.status(t), "CORE")
	assert.Equal(t, "adaptive", st.LimitMode)
	assert.Less(t, st.Limit, 12, "the limit settles well below the ceiling of 16")
	assert.GreaterOrEqual(t, st.Limit, 2, "and never below the floor")
	assert.Equal(t, 16, statusOf(t, static.hub.status(t), "CORE").Limit, "the static limit stays where it was set")
	assert.Equal(t, float64(st.Limit), adaptive.hub.metric(t, `relay_bulkhead_limit{target="CORE"}`))
	t.Logf("after the cut: static %d in doubt, %d booked; adaptive %d in doubt, %d booked, limit %d",
		static.inDoubt.Load(), static.booked.Load(), adaptive.inDoubt.Load(), adaptive.booked.Load(), st.Limit)
	assert.Less(t, adaptive.inDoubt.Load()*2, static.inDoubt.Load(), "the adaptive hub leaves less than half as many calls in doubt")
	assert.Contains(t, adaptive.hub.Stderr(), "bulkhead limit changed")
	assert.Contains(t, adaptive.hub.Stderr(), `"reason":"`)
	require.NotContains(t, static.hub.Stderr(), "bulkhead limit changed")
}
