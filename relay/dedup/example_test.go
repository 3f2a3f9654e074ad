package dedup_test

import (
	"fmt"
	"time"

	"github.com/relayhub/relayhub/relay/dedup"
)

// A first line claims its TXID and leads the call; a copy that arrives
// while it is in flight joins it; once settled, a resend is answered from
// memory, and the same TXID with another payload is a conflict.
func Example() {
	s := dedup.New(dedup.Config{})
	payload := []byte("WD 1001 500")

	v, lead, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W1"), dedup.HashPayload(payload), nil)
	fmt.Println(v == dedup.Claimed)

	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("W1"), dedup.HashPayload(payload), func() dedup.Waiter { return printer{} })
	fmt.Println(v == dedup.Joined)

	for _, w := range s.Settle(lead, dedup.Answered, "0000", []byte("balance=99500"), 10*time.Minute) {
		w.Answer("0000", []byte("balance=99500"))
	}

	_, _, code, msg := s.Begin("CORE", dedup.Scope{}, []byte("W1"), dedup.HashPayload(payload), nil)
	fmt.Println(code, msg)

	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("W1"), dedup.HashPayload([]byte("WD 1001 900")), nil)
	fmt.Println(v == dedup.Conflict)
	// Output:
	// true
	// true
	// copy answered 0000 balance=99500
	// 0000 balance=99500
	// true
}

// printer is a copy that prints its answer.
type printer struct{}

func (printer) Answer(code string, msg []byte) { fmt.Println("copy answered", code, string(msg)) }
