package relay

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/resolver"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// resolveRig is a hub with a journal, the shield and metrics, in front of
// a core fixture whose late mode books a transaction and never answers
// (until the hub gives up on it).
type resolveRig struct {
	srv     *Server
	core    *fixtures.Server
	url     string
	clk     *fakeclock.Clock
	reg     *prometheus.Registry
	journal string
	j       *indoubt.Journal
	target  Target
	c       *hubtest.Client
}

// holdForever is a fixture's Wait that returns only when the caller gives
// up, so a late-mode call is booked and never answered.
func holdForever(ctx context.Context, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// newCore starts a core fixture in late mode that never answers.
func newCore(t *testing.T) (*fixtures.Server, string) {
	core, err := fixtures.New(fixtures.Config{Kind: fixtures.KindCore, Mode: fixtures.ModeLate, Wait: holdForever})
	require.NoError(t, err)
	ts := httptest.NewServer(core)
	t.Cleanup(ts.Close)
	return core, ts.URL
}

// newResolveRig starts the rig; edit changes the target and the Config
// before New.
func newResolveRig(t *testing.T, edit func(*Target, *Config)) *resolveRig {
	core, url := newCore(t)
	rig := &resolveRig{core: core, url: url, reg: prometheus.NewRegistry(), journal: filepath.Join(t.TempDir(), "in-doubt.log")}
	j, err := indoubt.Open(indoubt.Config{Path: rig.journal})
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	rig.j = j
	m, err := NewMetrics(rig.reg)
	require.NoError(t, err)
	tgt := Target{Name: "CORE", URL: url, StatusURL: url + "/tx/{txid}"}
	cfg, clk := testConfig(t)
	cfg.TargetTimeout, cfg.Dedup, cfg.NoLateAnswer = 100*time.Millisecond, true, true
	cfg.InDoubtLog, cfg.Metrics, cfg.HubID = j, m, "hub-test"
	if edit != nil {
		edit(&tgt, &cfg)
	}
	cfg.Targets, rig.target = append([]Target{tgt}, cfg.Targets...), tgt
	var addr string
	rig.srv, addr = startServer(t, cfg)
	rig.clk = clk
	rig.c = hubtest.Dial(t, addr)
	return rig
}

// exchangeInDoubt sends line, checks that it is answered E901, and waits
// for the resolver to hold it (it takes it once the client has its
// answer).
func (rig *resolveRig) exchangeInDoubt(t *testing.T, line string) {
	t.Helper()
	n := len(rig.srv.OpenInDoubt())
	require.Equal(t, "E901", rig.c.Exchange(line).Code)
	hubtest.Eventually(t, func() bool { return len(rig.srv.OpenInDoubt()) == n+1 }, "entry open")
}

// advance moves the clock on and wakes the resolver.
func (rig *resolveRig) advance(d time.Duration) {
	rig.clk.Advance(d)
	rig.srv.pokeResolver()
}

// resolutions returns the journal's resolution lines.
func (rig *resolveRig) resolutions(t *testing.T) []map[string]any {
	var out []map[string]any
	for _, l := range logtest.FileLines(t, rig.journal) {
		if indoubt.IsResolution(l["stage"].(string)) {
			out = append(out, l)
		}
	}
	return out
}

// waitSettled waits for the journal's n-th resolution line and returns it.
func (rig *resolveRig) waitSettled(t *testing.T, n int) map[string]any {
	hubtest.Eventually(t, func() bool { return len(rig.resolutions(t)) >= n }, "resolution journalled")
	return rig.resolutions(t)[n-1]
}

func TestALookupSettlesACallInDoubtAsApplied(t *testing.T) {
	rig := newResolveRig(t, nil)

	// Given W1, booked by CORE and answered E901 by the hub,
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")
	st := status(t, rig.srv, "CORE")
	assert.Equal(t, 1, st.InDoubtOpen)
	assert.Equal(t, "lookup", st.Resolve)
	assert.Equal(t, rig.clk.Now(), st.InDoubtOldest)
	assert.Equal(t, rig.clk.Now().Add(resolver.DefaultResolveAfter), st.NextResolve)
	open := rig.srv.OpenInDoubt()
	require.Len(t, open, 1)
	assert.Equal(t, "W1", open[0].TxID)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_open", "target", "CORE"))

	// when the first attempt is due,
	rig.advance(resolver.DefaultResolveAfter)

	// then the hub looks it up, journals it applied and forgets it,
	l := rig.waitSettled(t, 1)
	assert.Equal(t, "W1", l["txid"])
	assert.Equal(t, indoubt.StageResolvedApplied, l["stage"])
	assert.Equal(t, indoubt.ViaLookup, l["via"])
	assert.Equal(t, "0000", l["code"])
	assert.Equal(t, rig.url, l["url"])
	hubtest.Eventually(t, func() bool { return status(t, rig.srv, "CORE").InDoubtOpen == 0 }, "entry settled")
	assert.Zero(t, status(t, rig.srv, "CORE").NextResolve)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_resolved_total", "target", "CORE", "outcome", "applied", "via", "lookup"))
	assert.Zero(t, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_open", "target", "CORE"))
	assert.Zero(t, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_resolved_total", "target", "CORE", "outcome", "expired", "via", "lookup"))
	// and a resend gets the booked answer without a call.
	assert.Equal(t, "0000", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").Code)
	stats := rig.core.Stats()
	assert.Equal(t, int64(1), stats.Calls)
	assert.Equal(t, int64(1), stats.Lookups)
}

func TestALookupThatSaysNotAppliedLetsAResendCallAfresh(t *testing.T) {
	rig := newResolveRig(t, nil)
	mode := fixtures.ModeSlow
	_, err := rig.core.SetControl(fixtures.ControlUpdate{Mode: &mode})
	require.NoError(t, err)

	// Given W1, which CORE held without applying it until the hub gave up,
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")
	normal := fixtures.ModeNormal
	_, err = rig.core.SetControl(fixtures.ControlUpdate{Mode: &normal})
	require.NoError(t, err)

	// when the look-up is due,
	rig.advance(resolver.DefaultResolveAfter)

	// then it is journalled not applied,
	l := rig.waitSettled(t, 1)
	assert.Equal(t, indoubt.StageResolvedNotApplied, l["stage"])
	assert.Equal(t, indoubt.ViaLookup, l["via"])
	// and a resend is one fresh call.
	assert.Equal(t, "W1|0000|from=97500 to=102500", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").String())
	assert.Equal(t, int64(2), rig.core.Stats().Calls)
	assert.True(t, rig.core.Lookup("W1").Applied)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_resolved_total", "target", "CORE", "outcome", "not_applied", "via", "lookup"))
}

func TestAReversalUndoesATransactionAndAResendGetsE910(t *testing.T) {
	rig := newResolveRig(t, func(tgt *Target, cfg *Config) {
		tgt.ReverseURL = tgt.URL + "/tx/{txid}/reverse"
		cfg.Resolve = resolver.PolicyReverse
	})
	// Given W2, booked by CORE and answered E901,
	rig.exchangeInDoubt(t, "W2|CORE|XFER 1001 1002 2500")
	require.True(t, rig.core.Lookup("W2").Applied)
	// a resend meanwhile is not looked up (a look-up during the reversal
	// would read "not applied" and call afresh),
	assert.Equal(t, "W2|E901|outcome still unknown; do not resend yet", rig.c.Exchange("W2|CORE|XFER 1001 1002 2500").String())
	assert.Zero(t, rig.core.Stats().Lookups)

	// when the reversal is due,
	rig.advance(resolver.DefaultResolveAfter)

	// then CORE reverses it once, and the journal says so,
	l := rig.waitSettled(t, 1)
	assert.Equal(t, indoubt.StageResolvedReversed, l["stage"])
	assert.Equal(t, indoubt.ViaReversal, l["via"])
	assert.Equal(t, int64(1), rig.core.Stats().Reversals)
	assert.True(t, rig.core.Lookup("W2").Reversed)
	// and a resend gets E910 without a call.
	assert.Equal(t, "W2|E910|transaction reversed; resend under a new TXID", rig.c.Exchange("W2|CORE|XFER 1001 1002 2500").String())
	assert.Equal(t, int64(1), rig.core.Stats().Calls)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_resolved_total", "target", "CORE", "outcome", "reversed", "via", "reversal"))
}

func TestNoAttemptWhileTheBreakerIsOpen(t *testing.T) {
	rig := newResolveRig(t, nil)
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")

	// Given CORE's breaker held open,
	_, err := rig.srv.ControlBreaker("CORE", ActionOpen)
	require.NoError(t, err)

	// when the attempt is due, then it waits: no look-up reaches CORE,
	due := rig.clk.Now().Add(resolver.DefaultResolveAfter)
	rig.advance(resolver.DefaultResolveAfter)
	hubtest.Eventually(t, func() bool { return status(t, rig.srv, "CORE").NextResolve.After(due) }, "attempt put off")
	assert.Zero(t, rig.core.Stats().Lookups)
	assert.Equal(t, 1, status(t, rig.srv, "CORE").InDoubtOpen)

	// and once the breaker closes, the next one goes.
	_, err = rig.srv.ControlBreaker("CORE", ActionClose)
	require.NoError(t, err)
	rig.advance(resolver.DefaultResolveAfter)
	assert.Equal(t, indoubt.ViaLookup, rig.waitSettled(t, 1)["via"])
	assert.Equal(t, int64(1), rig.core.Stats().Lookups)
	snap := status(t, rig.srv, "CORE").Snapshot
	assert.Zero(t, snap.ConsecutiveFailures, "attempts never count for the breaker")
}

func TestALateAnswerSettlesTheEntry(t *testing.T) {
	core, err := fixtures.New(fixtures.Config{Kind: fixtures.KindCore, Mode: fixtures.ModeLate, Delay: 300 * time.Millisecond})
	require.NoError(t, err)
	ts := httptest.NewServer(core)
	t.Cleanup(ts.Close)
	rig := newResolveRig(t, func(tgt *Target, cfg *Config) {
		tgt.URL, tgt.StatusURL = ts.URL, ts.URL+"/tx/{txid}"
		cfg.NoLateAnswer = false
	})

	// Given W1, answered after the target timeout,
	require.Equal(t, "E901", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").Code)

	// then its answer, read on, settles it without a look-up,
	l := rig.waitSettled(t, 1)
	assert.Equal(t, indoubt.StageResolvedApplied, l["stage"])
	assert.Equal(t, indoubt.ViaLateAnswer, l["via"])
	hubtest.Eventually(t, func() bool { return status(t, rig.srv, "CORE").InDoubtOpen == 0 }, "entry settled")
	assert.Zero(t, core.Stats().Lookups)
	// and a resend gets that answer without a call.
	assert.Equal(t, "W1|0000|from=97500 to=102500", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").String())
	assert.Equal(t, int64(1), core.Stats().Calls)
}

func TestAnOperatorSettlesAManualEntry(t *testing.T) {
	rig := newResolveRig(t, func(tgt *Target, _ *Config) { tgt.StatusURL = "" })
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")
	require.Equal(t, "manual", status(t, rig.srv, "CORE").Resolve)
	open := rig.srv.OpenInDoubt()
	require.Len(t, open, 1)
	assert.Zero(t, open[0].Next, "a manual entry has no attempt")

	assert.ErrorIs(t, rig.srv.SettleInDoubt("CORE", "W9", true, "0000"), ErrNotInDoubt)
	assert.ErrorIs(t, rig.srv.SettleInDoubt("NOPE", "W1", true, "0000"), ErrNotInDoubt)
	assert.ErrorIs(t, rig.srv.SettleInDoubt("core", "W1", true, "OK"), ErrBadSettleCode)

	// When the operator settles it applied,
	require.NoError(t, rig.srv.SettleInDoubt("core", "W1", true, "0000"))

	// then it is journalled via operator and a resend gets 0000 without a call.
	l := rig.waitSettled(t, 1)
	assert.Equal(t, indoubt.ViaOperator, l["via"])
	assert.Equal(t, "0000", l["code"])
	assert.Empty(t, rig.srv.OpenInDoubt())
	assert.Equal(t, "0000", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").Code)
	assert.Equal(t, int64(1), rig.core.Stats().Calls)
	assert.ErrorIs(t, rig.srv.SettleInDoubt("CORE", "W1", false, ""), ErrNotInDoubt, "settled once")
}

func TestAResendOfAnOpenEntryIsLookedUpAndTheResolverForgetsIt(t *testing.T) {
	rig := newResolveRig(t, nil)
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")

	// When the client resends W1 before the resolver's attempt,
	assert.Equal(t, "W1|0000|from=97500 to=102500", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").String())

	// then the resend's look-up settles it, journalled via resend, once.
	l := rig.waitSettled(t, 1)
	assert.Equal(t, indoubt.ViaResend, l["via"])
	assert.Empty(t, rig.srv.OpenInDoubt())
	rig.advance(resolver.DefaultResolveAfter)
	assert.Equal(t, int64(1), rig.core.Stats().Lookups)
	assert.Len(t, rig.resolutions(t), 1)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_resolved_total", "target", "CORE", "outcome", "applied", "via", "resend"))
}

func TestARestartedHubTakesUpTheOpenEntriesOfItsJournal(t *testing.T) {
	// Given a hub stopped with W5 and W6 in doubt, and a journal that also
	// holds W7 in doubt for two days and W8 of a target gone since,
	rig := newResolveRig(t, nil)
	rig.exchangeInDoubt(t, "W5|CORE|XFER 1001 1002 2500")
	rig.exchangeInDoubt(t, "W6|CORE|XFER 1001 1002 100")
	require.NoError(t, rig.srv.Close())
	for _, e := range []indoubt.Entry{
		{Time: time.Now().Add(-48 * time.Hour), TxID: "W7", Target: "CORE", URL: rig.url, Code: "E901", Stage: "request_sent"},
		{Time: time.Now().Add(-time.Minute), TxID: "W8", Target: "GONE", URL: rig.url, Code: "E901", Stage: "request_sent"},
	} {
		require.NoError(t, rig.j.Append(&e))
	}
	require.NoError(t, rig.j.Close())

	// when a hub starts on the same journal,
	j, err := indoubt.Open(indoubt.Config{Path: rig.journal})
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	cfg, clk := testConfig(t, rig.target)
	cfg.TargetTimeout, cfg.Dedup, cfg.NoLateAnswer = 100*time.Millisecond, true, true
	cfg.InDoubtLog, cfg.Metrics, cfg.HubID = j, m, "hub-test"
	srv, addr := startServer(t, cfg)

	// then it holds W5 and W6 open, and has given W7 up,
	open := srv.OpenInDoubt()
	require.Len(t, open, 2)
	assert.Equal(t, "W5", open[0].TxID)
	assert.Equal(t, "W6", open[1].TxID)
	assert.WithinDuration(t, clk.Now(), open[0].Since, 10*time.Second)
	lines := logtest.FileLines(t, rig.journal)
	last := lines[len(lines)-1]
	assert.Equal(t, "W7", last["txid"])
	assert.Equal(t, indoubt.StageUnresolvedExpired, last["stage"])
	assert.Equal(t, indoubt.ViaLookup, last["via"])
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, "relay_in_doubt_resolved_total", "target", "CORE", "outcome", "expired", "via", "lookup"))
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, "relay_in_doubt_open", "target", "CORE"))

	// a resend of W6 is looked up at once, as in doubt, without a call,
	c := hubtest.Dial(t, addr)
	assert.Equal(t, "W6|0000|from=97400 to=102600", c.Exchange("W6|CORE|XFER 1001 1002 100").String())
	assert.Equal(t, int64(2), rig.core.Stats().Calls)
	require.Len(t, srv.OpenInDoubt(), 1)

	// and W5 is settled by the resolver when its attempt is due.
	clk.Advance(resolver.DefaultResolveAfter)
	srv.pokeResolver()
	hubtest.Eventually(t, func() bool { return len(srv.OpenInDoubt()) == 0 }, "W5 settled")
	lines = logtest.FileLines(t, rig.journal)
	hubtest.Eventually(t, func() bool {
		lines = logtest.FileLines(t, rig.journal)
		return lines[len(lines)-1]["txid"] == "W5"
	}, "W5 journalled")
	assert.Equal(t, indoubt.ViaLookup, lines[len(lines)-1]["via"])
	assert.Equal(t, indoubt.StageResolvedApplied, lines[len(lines)-1]["stage"])
}

func TestAnEntryThatStaysUnknownExpires(t *testing.T) {
	rig := newResolveRig(t, func(_ *Target, cfg *Config) { cfg.ResolveExpire = 3 * time.Second; cfg.ResolveAfter = time.Second })
	// Given a status URL that always fails,
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")
	fail := fixtures.ModeFail
	_, err := rig.core.SetControl(fixtures.ControlUpdate{Mode: &fail})
	require.NoError(t, err)

	// when its expiry passes, attempt after attempt,
	for range 4 {
		rig.advance(time.Second)
		hubtest.Eventually(t, func() bool {
			open := rig.srv.OpenInDoubt()
			return len(open) == 0 || (!open[0].InFlight && open[0].Next.After(rig.clk.Now()))
		}, "attempt done")
	}

	// then the hub gives it up, journalled and counted,
	l := rig.waitSettled(t, 1)
	assert.Equal(t, indoubt.StageUnresolvedExpired, l["stage"])
	assert.Equal(t, "E901", l["code"])
	assert.Equal(t, 1.0, hubtest.MetricValue(t, rig.reg, "relay_in_doubt_resolved_total", "target", "CORE", "outcome", "expired", "via", "lookup"))
	assert.Positive(t, rig.core.Stats().Lookups)
	// and a resend is still in doubt: looked up, not sent.
	assert.Equal(t, "E901", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").Code)
	assert.Equal(t, int64(1), rig.core.Stats().Calls)
}

func TestAReloadChangesTheResolvePolicy(t *testing.T) {
	rig := newResolveRig(t, nil)
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")

	// When a reload makes CORE manual,
	tgt := rig.target
	tgt.Settings = &TargetSettings{TargetTimeout: 100 * time.Millisecond, Dedup: true, Resolve: resolver.PolicyManual}
	res, err := rig.srv.Reload([]Target{tgt})
	require.NoError(t, err)
	assert.Equal(t, []string{"CORE"}, res.Changed)

	// then its entry waits for an operator.
	assert.Equal(t, "manual", status(t, rig.srv, "CORE").Resolve)
	assert.Zero(t, status(t, rig.srv, "CORE").NextResolve)
	rig.advance(time.Hour)
	assert.Equal(t, 1, status(t, rig.srv, "CORE").InDoubtOpen)
	assert.Zero(t, rig.core.Stats().Lookups)
}

// memStore is a fleet's store in memory, shared by the hubs of a test.
type memStore struct {
	mu   sync.Mutex
	recs map[string]dedup.Record
}

var _ dedup.Store = (*memStore)(nil)

func storeKey(target string, scope dedup.Scope, txid string) string {
	id, _ := scope.Client()
	return target + "|" + string(id[:]) + "|" + txid
}

func (m *memStore) Claim(_ context.Context, target string, scope dedup.Scope, txid string, rec dedup.Record, _ time.Duration) (dedup.Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := storeKey(target, scope, txid)
	if ex, ok := m.recs[k]; ok {
		return ex, false, nil
	}
	m.recs[k] = rec
	return dedup.Record{}, true, nil
}

func (m *memStore) Settle(_ context.Context, target string, scope dedup.Scope, txid string, rec dedup.Record, _ time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[storeKey(target, scope, txid)] = rec
	return nil
}

func (m *memStore) Release(_ context.Context, target string, scope dedup.Scope, txid, hub string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := storeKey(target, scope, txid)
	if m.recs[k].Hub == hub && m.recs[k].State == dedup.InFlight {
		delete(m.recs, k)
	}
	return nil
}

func TestASettlementReachesTheFleetsStore(t *testing.T) {
	store := &memStore{recs: make(map[string]dedup.Record)}
	rig := newResolveRig(t, func(_ *Target, cfg *Config) { cfg.DedupStore = store })
	// Given W3 in doubt on hub A, settled applied by its look-up,
	rig.exchangeInDoubt(t, "W3|CORE|XFER 1001 1002 2500")
	rig.advance(resolver.DefaultResolveAfter)
	rig.waitSettled(t, 1)

	// when the client resends W3 to hub B of the same fleet,
	cfg, _ := testConfig(t, rig.target)
	cfg.TargetTimeout, cfg.Dedup, cfg.DedupStore, cfg.HubID = 100*time.Millisecond, true, store, "hub-b"
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// then B answers it from the store, without a call or a look-up.
	assert.Equal(t, "W3|0000|from=97500 to=102500", c.Exchange("W3|CORE|XFER 1001 1002 2500").String())
	assert.Equal(t, int64(1), rig.core.Stats().Calls)
	assert.Equal(t, int64(1), rig.core.Stats().Lookups)
}

func TestAFallbacksCallInDoubtIsSettledUnderTheNamedTargetsShield(t *testing.T) {
	back, backURL := newCore(t)
	rig := newResolveRig(t, func(tgt *Target, cfg *Config) {
		tgt.Fallback = "BACK"
		cfg.Targets = []Target{{Name: "BACK", URL: backURL, StatusURL: backURL + "/tx/{txid}"}}
	})
	// Given CORE held open, so that BACK takes W1, books it and never
	// answers,
	_, err := rig.srv.ControlBreaker("CORE", ActionOpen)
	require.NoError(t, err)
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")
	require.Equal(t, "BACK", rig.srv.OpenInDoubt()[0].Target)

	// when BACK's look-up finds it applied,
	rig.advance(resolver.DefaultResolveAfter)
	l := rig.waitSettled(t, 1)
	assert.Equal(t, "BACK", l["target"])

	// then a resend to CORE gets BACK's answer, naming it, without a call.
	assert.Equal(t, "W1|0000|via BACK: from=97500 to=102500", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").String())
	assert.Equal(t, int64(1), back.Stats().Calls)
	assert.Zero(t, rig.core.Stats().Calls)
}

func TestATargetsGateLooksAtItsBreakerAndTakesItsBulkhead(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:9201"})
	cfg.MaxInflight = 1
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	rt := srv.table.lookup([]byte("CORE"))
	g := targetGate{rt}

	// The bulkhead's one slot goes to the first attempt, none to a second,
	require.True(t, g.TryAcquire())
	assert.Equal(t, 1, rt.bulkhead.InFlight())
	assert.False(t, g.TryAcquire())
	g.Release()
	assert.Zero(t, rt.bulkhead.InFlight())

	// and the breaker is only looked at: closed allows, held open does
	// not, and no look takes a ticket or a probe.
	assert.True(t, g.Allow())
	_, err = srv.ControlBreaker("CORE", ActionOpen)
	require.NoError(t, err)
	assert.False(t, g.Allow())
	_, err = srv.ControlBreaker("CORE", ActionClose)
	require.NoError(t, err)
	assert.True(t, g.Allow())
	assert.Zero(t, status(t, srv, "CORE").Snapshot.ConsecutiveFailures)
}

func TestStoppingEndsTheLateReads(t *testing.T) {
	core, err := fixtures.New(fixtures.Config{Kind: fixtures.KindCore, Mode: fixtures.ModeLate, Delay: time.Minute})
	require.NoError(t, err)
	ts := httptest.NewServer(core)
	t.Cleanup(ts.Close)
	rig := newResolveRig(t, func(tgt *Target, cfg *Config) {
		tgt.URL, tgt.StatusURL = ts.URL, ts.URL+"/tx/{txid}"
		cfg.NoLateAnswer = false
	})
	// Given W1 timed out and its connection read on for a late answer,
	rig.exchangeInDoubt(t, "W1|CORE|XFER 1001 1002 2500")
	require.Equal(t, int64(1), core.Stats().InFlight)

	// when the hub shuts down, its calls all answered,
	require.NoError(t, rig.srv.Shutdown(context.Background()))

	// then that connection is closed too, long before the grace ends, and
	// nothing was settled.
	hubtest.Eventually(t, func() bool { return core.Stats().InFlight == 0 }, "late read closed")
	assert.Empty(t, rig.resolutions(t))
}

func TestALateAnswerThatComesBeforeItsCallIsJournalledSettlesItThen(t *testing.T) {
	rig := newResolveRig(t, nil)
	rt := rig.srv.table.lookup([]byte("CORE"))
	// Given late answers read before their calls reached the resolver
	// (their calls still on their way through the journal): a target's
	// 0000 for W1, an HTTP 500 for W2,
	rig.srv.lateAnswer(rt, targethttp.LateAnswer{TxID: "W1", Code: "0000", Msg: []byte("booked late")})
	rig.srv.lateAnswer(rt, targethttp.LateAnswer{TxID: "W2", Code: "E500", Msg: []byte("HTTP 500")})

	// when the calls end in doubt,
	require.Equal(t, "E901", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").Code)
	rig.exchangeInDoubt(t, "W2|CORE|XFER 1001 1002 100")

	// then W1 is settled at once with the answer's message, and W2, whose
	// answer was no target's, waits for its look-up.
	l := rig.waitSettled(t, 1)
	assert.Equal(t, "W1", l["txid"])
	assert.Equal(t, indoubt.ViaLateAnswer, l["via"])
	assert.Equal(t, "W1|0000|booked late", rig.c.Exchange("W1|CORE|XFER 1001 1002 2500").String())
	open := rig.srv.OpenInDoubt()
	require.Len(t, open, 1)
	assert.Equal(t, "W2", open[0].TxID)
}
