package breakerlog_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
)

func Example() {
	dir, err := os.MkdirTemp("", "breakerlog-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "breaker.log")

	bl, err := breakerlog.Open(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	at := time.Date(2026, 11, 30, 5, 31, 19, 123_000_000, time.UTC)
	for _, t := range []breaker.Transition{
		{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at},
		{Name: "CORE", From: breaker.Open, To: breaker.HalfOpen, At: at.Add(10 * time.Second)},
		{Name: "CORE", From: breaker.HalfOpen, To: breaker.Closed, At: at.Add(10*time.Second + 42*time.Millisecond)},
	} {
		if err := bl.Write(t); err != nil {
			fmt.Println(err)
		}
	}
	if err := bl.Close(); err != nil {
		fmt.Println(err)
	}

	text, _ := os.ReadFile(path)
	fmt.Print(string(text))

	entries, _, err := breakerlog.ReadFile(path)
	fmt.Println(len(entries), "entries, read error:", err)
	fmt.Println("chain error:", breakerlog.CheckChains(entries))
	// Output:
	// 2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN
	// 2026-11-30T05:31:29.123Z|CORE|OPEN->HALF_OPEN
	// 2026-11-30T05:31:29.165Z|CORE|HALF_OPEN->CLOSED
	// 3 entries, read error: <nil>
	// chain error: <nil>
}
