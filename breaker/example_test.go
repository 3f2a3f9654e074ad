package breaker_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
)

func Example() {
	clk := fakeclock.New(time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC))
	b := breaker.New(breaker.Settings{
		Name: "CORE",
		Policy: breaker.Policy{
			FailThreshold: 2,
			ResetTimeout:  10 * time.Second,
		},

		Clock: clk,
		OnTransition: func(t breaker.Transition) {
			fmt.Printf("%s %s->%s\n", t.Name, t.From, t.To)
		},
	})

	for range 2 {
		ticket, _, _ := b.Allow()
		b.Done(ticket, true, 0) // the target failed
	}
	if _, retryAfter, err := b.Allow(); errors.Is(err, breaker.ErrOpen) {
		fmt.Println("refused; retry after", retryAfter)
	}

	clk.Advance(10 * time.Second)
	probe, _, _ := b.Allow()
	b.Done(probe, false, 0) // the target answered
	// Output:
	// CORE CLOSED->OPEN
	// refused; retry after 10s
	// CORE OPEN->HALF_OPEN
	// CORE HALF_OPEN->CLOSED
}
