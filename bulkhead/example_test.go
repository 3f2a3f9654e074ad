package bulkhead_test

import (
	"fmt"

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
