package replay_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/replay"
)

// A CORE call that succeeded, three that failed, and a request the hub's
// breaker (threshold 5) did not refuse: would a threshold of 3 have
// opened CORE, and refused that request?
const accessLog = `{"time":"2026-11-30T08:00:00.002Z","txid":"T1","target":"CORE","code":"0000","duration_ms":2,"bytes":8,"breaker":"admitted","start":"2026-11-30T08:00:00.000000000Z","end":"2026-11-30T08:00:00.002000000Z"}
{"time":"2026-11-30T08:00:00.011Z","txid":"T2","target":"CORE","code":"E500","duration_ms":1,"bytes":8,"breaker":"admitted","start":"2026-11-30T08:00:00.010000000Z","end":"2026-11-30T08:00:00.011000000Z"}
{"time":"2026-11-30T08:00:00.021Z","txid":"T3","target":"CORE","code":"E500","duration_ms":1,"bytes":8,"breaker":"admitted","start":"2026-11-30T08:00:00.020000000Z","end":"2026-11-30T08:00:00.021000000Z"}
{"time":"2026-11-30T08:00:00.031Z","txid":"T4","target":"CORE","code":"E901","duration_ms":1,"bytes":8,"breaker":"admitted","start":"2026-11-30T08:00:00.030000000Z","end":"2026-11-30T08:00:00.031000000Z"}
{"time":"2026-11-30T08:00:00.042Z","txid":"T5","target":"CORE","code":"0000","duration_ms":2,"bytes":8,"breaker":"admitted","start":"2026-11-30T08:00:00.040000000Z","end":"2026-11-30T08:00:00.042000000Z"}
`

func Example() {
	src := replay.Source{Name: "access.log", Open: func() (io.ReadCloser, error) {
		return io.NopCloser(strings.NewReader(accessLog)), nil
	}}
	hub := replay.Settings{Name: "hub", Defaults: relay.TargetSettings{Policy: breaker.Policy{FailThreshold: 5}}}
	tighter, err := hub.Override("threshold 3", "--compare", []string{"fail_threshold=3"})
	if err != nil {
		fmt.Println(err)
		return
	}
	rep, err := replay.Run(context.Background(), replay.Config{Sets: []replay.Settings{hub, tighter}}, []replay.Source{src})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, set := range rep.Sets {
		fmt.Printf("%s: %d transitions, %d refused\n", set.Name, len(set.Transitions), set.Targets[0].Refused)
	}
	_ = rep.WriteText(os.Stdout, "CORE")
	// Output:
	// hub: 0 transitions, 0 refused
	// threshold 3: 1 transitions, 1 refused
	// read 5 lines of 1 source, 2026-11-30T08:00:00.002Z to 2026-11-30T08:00:00.042Z
	//   requests replayed through a breaker: 5
	//   lines that reached no breaker (E900, E903, E906): 0
	//
	// settings hub:
	//   CORE: fail_threshold=5 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902
	// transitions hub (0):
	//
	// settings threshold 3:
	//   CORE: fail_threshold=3 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902
	// transitions threshold 3 (1):
	// 2026-11-30T08:00:00.031Z|CORE|CLOSED->OPEN
	//
	//   CORE                              logged  hub  threshold 3
	//   requests                               5    5            5
	//   calls made                             5    5            4
	//     failed (reached a sick target)       3    3            3
	//     outcome inferred                     -    0            0
	//   refused E904                           0    0            1
	//   handed back E905                       0    0            0
	//   to fallback                            0    0            0
	//   probes                                 0    0            0
	//   times opened                           -    0            1
	//   time open or half-open                 -   0s         11ms
}
