package bulkhead_test

import (
	"fmt"
	"time"

	"github.com/relayhub/relayhub/bulkhead"
)

func Example() {
	bh := bulkhead.New(bulkhead.Settings{MaxInflight: 2})

	call := func(txid string) string {
		if !bh.TryAcquire() {
			return txid + "|E905|bulkhead full"
		}
		// A real caller defers Release so the slot is given back however
		// the call ends; here the slots stay held to show the refusal.
		return txid + "|0000|admitted"
	}

	fmt.Println(call("tx1"))
	fmt.Println(call("tx2"))
	fmt.Println(call("tx3"))
	fmt.Println("in flight:", bh.InFlight(), "of", bh.Limit())

	bh.Release()
	fmt.Println(call("tx4"))
	// Output:
	// tx1|0000|admitted
	// tx2|0000|admitted
	// tx3|E905|bulkhead full
	// in flight: 2 of 2
	// tx4|0000|admitted
}

func ExampleAdaptive() {
	bh := bulkhead.New(bulkhead.Settings{MaxInflight: 64})
	limit := bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: 64, Min: 2})
	now := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)

	// Every call that ends reports its outcome; refusals are not reported.
	// Here every call for two windows ends in doubt (E901).
	for range 100 {
		now = now.Add(11 * time.Millisecond)
		if ch, moved := limit.Record(now, bulkhead.Overloaded, 0, 64); moved {
			bh.SetLimit(ch.To)
			fmt.Printf("%d -> %d: %s\n", ch.From, ch.To, ch.Reason)
		}
	}
	fmt.Println("limit:", bh.Limit())
	// Output:
	// 64 -> 58: calls in doubt
	// 58 -> 52: calls in doubt
	// limit: 52
}
