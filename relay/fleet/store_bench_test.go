package fleet

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/relayhub/relayhub/internal/testutil/redistest"
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
