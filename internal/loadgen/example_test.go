package loadgen_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http/httptest"
	"slices"
	"time"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/relay"
)

// Example load-tests a hub that serves a core banking and a claims fixture,
// and prints what the report says about the answers.
func Example() {
	var targets []relay.Target
	for _, fx := range []fixtures.Config{{Name: "CORE", Kind: fixtures.KindCore}, {Name: "CLAIM", Kind: fixtures.KindClaim}} {
		h, err := fixtures.New(fx)
		if err != nil {
			panic(err)
		}
		ts := httptest.NewServer(h)
		defer ts.Close()
		targets = append(targets, relay.Target{Name: fx.Name, URL: ts.URL})
	}
	hub, err := relay.New(relay.Config{Targets: targets})
	if err != nil {
		panic(err)
	}
	defer hub.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go hub.Serve(ln)

	mix, err := loadgen.ParseMix("CORE=1,CLAIM=1")
	if err != nil {
		panic(err)
	}
	balance, err := loadgen.ParseTemplate("BAL ACC{conn}")
	if err != nil {
		panic(err)
	}
	status, err := loadgen.ParseTemplate("STATUS CLM-{n}")
	if err != nil {
		panic(err)
	}
	// Four connections with two requests each in flight stay within the
	// hub's default bulkhead of ten calls per target, so none gets E905.
	g, err := loadgen.New(loadgen.Config{
		Addr:     ln.Addr().String(),
		Conns:    4,
		Depth:    2,
		Requests: 200,
		Drain:    5 * time.Second,
		Mix:      mix,
		Payloads: []loadgen.Template{balance, status},
	})
	if err != nil {
		panic(err)
	}
	res, err := g.Run(context.Background())
	if err != nil {
		panic(err)
	}

	sum := g.Summary(res)
	fmt.Println("sent", sum.Sent, "answered", sum.Answered)
	for _, target := range []string{"CORE", "CLAIM"} {
		fmt.Println(target, slices.Sorted(maps.Keys(sum.TargetCodes[target])))
	}
	fmt.Printf("problems: %q\n", sum.Problems())
	// Output:
	// sent 200 answered 200
	// CORE [0000]
	// CLAIM [B212]
	// problems: ""
}
