package fleet

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/relay/dedup"
)

// BenchmarkStoreRead runs the read script, the fleet's most frequent
// command (every target, every hub, every second), against a real
// redis-server holding an open record, and reports Redis's own CPU per
// call (INFO commandstats) as redis-µs/op: what bounds how many hubs and
// targets one Redis carries (docs/FLEET.md).
func BenchmarkStoreRead(b *testing.B) {
	benchScript(b, scriptRead)
}

// BenchmarkStoreLease runs the lease script while another hub holds the
// lease: the probe stage's command.
func BenchmarkStoreLease(b *testing.B) {
	benchScript(b, scriptLease, "4000")
}

func benchScript(b *testing.B, s *redis.Script, extra ...any) {
	srv := redistest.Start(b)
	f, err := New(Config{Store: srv.URL(), HubID: "bench", Targets: []string{"CORE"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	ctx := context.Background()
	t := f.byName["CORE"]
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { _ = rdb.Close() })
	rdb.Set(ctx, t.keys[1], "7", 0)
	rdb.Set(ctx, t.keys[0], "7|hub-a|results|10000|99999999999999|0", 0)
	rdb.Set(ctx, t.keys[2], "hub-a", 0)
	t.known = 7
	if _, err := f.runScript(ctx, s, t, 0, extra...); err != nil {
		b.Fatal(err)
	}
	rdb.ConfigResetStat(ctx)
	b.ResetTimer()
	for b.Loop() {
		if _, err := f.runScript(ctx, s, t, 0, extra...); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	info := rdb.Info(ctx, "commandstats").Val()
	for line := range strings.SplitSeq(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for field := range strings.SplitSeq(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_evalsha:")), ",") {
			if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
				if us, err := strconv.ParseFloat(v, 64); err == nil {
					b.ReportMetric(us, "redis-µs/op")
				}
			}
		}
	}
}

// BenchmarkDedupClaim claims a fresh transaction and settles it, as a hub
// does for each request when the fleet shares its shield: two round trips
// to a real redis-server. redis-µs/op is Redis's own CPU for both.
func BenchmarkDedupClaim(b *testing.B) {
	srv := redistest.Start(b)
	f, err := New(Config{Store: srv.URL(), HubID: "bench", Targets: []string{"CORE"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { _ = rdb.Close() })
	s := f.Dedup()
	claim := dedup.Record{State: dedup.InFlight, Hash: dedup.HashPayload([]byte("pay 10")), Hub: "bench"}
	answer := claim
	answer.State, answer.Code, answer.Message = dedup.Answered, "0000", "balance=100000"
	if _, _, err := s.Claim(ctx, "CORE", dedup.Scope{}, "warm-up", claim, time.Minute); err != nil {
		b.Fatal(err)
	}
	rdb.ConfigResetStat(ctx)
	n := 0
	b.ResetTimer()
	for b.Loop() {
		txid := "tx-" + strconv.Itoa(n)
		n++
		if _, claimed, err := s.Claim(ctx, "CORE", dedup.Scope{}, txid, claim, time.Minute); err != nil || !claimed {
			b.Fatalf("claim %s: %v %v", txid, claimed, err)
		}
		if err := s.Settle(ctx, "CORE", dedup.Scope{}, txid, answer, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var usec float64
	for line := range strings.SplitSeq(rdb.Info(ctx, "commandstats").Val(), "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_set:") {
			continue
		}
		_, fields, _ := strings.Cut(strings.TrimSpace(line), ":")
		for field := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				if us, err := strconv.ParseFloat(v, 64); err == nil {
					usec += us
				}
			}
		}
	}
	if n > 0 {
		b.ReportMetric(usec/float64(n), "redis-µs/op")
	}
}
