package resolver_test

import (
	"fmt"
	"time"

	"github.com/relayhub/relayhub/relay/resolver"
)

// printer prints each settlement, as a hub would journal it.
type printer struct{}

func (printer) Settled(s resolver.Settlement) {
	fmt.Printf("%s %s %s via %s after %d attempts\n", s.TxID, s.Outcome, s.Code, s.Via, s.Attempts)
}

func Example() {
	r := resolver.New(resolver.Config{Settler: printer{}, Rand: func() float64 { return 0 }})
	r.Configure("CORE", resolver.Target{Policy: resolver.PolicyLookup})
	start := time.Date(2026, 12, 1, 17, 30, 0, 0, time.UTC)
	r.Add(resolver.Entry{Target: "CORE", TxID: "W1", Since: start})

	// The caller's loop: wake at Next, make the attempts Due, hand each
	// result back. Here the target answers "not known" once, then
	// "applied".
	answers := []resolver.Result{resolver.Retry, resolver.LookupResult(true, "0000", "")}
	for _, res := range answers {
		next, _ := r.Next()
		fmt.Println("attempt at", next.Sub(start))
		for _, a := range r.Due(next) {
			r.Done(a, res, next)
		}
	}
	// Output:
	// attempt at 5s
	// attempt at 7.5s
	// W1 applied 0000 via lookup after 2 attempts
}
