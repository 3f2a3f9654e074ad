package hubtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Answer is how a Target answers one call: payload is the request's body,
// already read.
type Answer func(w http.ResponseWriter, r *http.Request, payload []byte)

// Target is a fake HTTP target on a loopback httptest.Server whose Answer a
// test switches at run time, and whose calls a test can hold in flight
// (BlockThen) to see the hub with calls outstanding. It is safe for
// concurrent use.
type Target struct {
	*httptest.Server
	calls   atomic.Int32
	entered chan string // TXIDs of calls as they arrive, when the answer blocks
	release chan struct{}
	once    sync.Once // closes release
	mu      sync.Mutex
	answer  Answer // guarded by mu
}

// NewTarget starts a Target answering with answer, which may be nil when
// the test calls Set before the first call. When the test ends, every held
// call is released and the server closed.
func NewTarget(t testing.TB, answer Answer) *Target {
	t.Helper()
	ft := &Target{entered: make(chan string, 1024), release: make(chan struct{}), answer: answer}
	ft.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ft.calls.Add(1)
		payload, _ := io.ReadAll(r.Body)
		ft.mu.Lock()
		a := ft.answer
		ft.mu.Unlock()
		a(w, r, payload)
	}))
	t.Cleanup(func() {
		ft.UnblockAll()
		ft.Close()
	})
	return ft
}

// Set switches the target's answer for the calls that follow.
func (ft *Target) Set(answer Answer) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.answer = answer
}

// Calls returns how many calls the target has received, whatever their
// answer.
func (ft *Target) Calls() int {
	return int(ft.calls.Load())
}

// BlockThen returns an Answer that reports each call's TXID (its X-Tx-Id
// header) to WaitEntered, holds the call until UnblockAll, then answers
// with then.
func (ft *Target) BlockThen(then Answer) Answer {
	return func(w http.ResponseWriter, r *http.Request, payload []byte) {
		ft.entered <- r.Header.Get("X-Tx-Id")
		<-ft.release
		then(w, r, payload)
	}
}

// UnblockAll releases every call held by BlockThen, now and later.
func (ft *Target) UnblockAll() {
	ft.once.Do(func() { close(ft.release) })
}

// WaitEntered waits until n more calls held by BlockThen have arrived and
// returns their TXIDs in the order they arrived. It fails the test if they
// have not within IOTimeout.
func (ft *Target) WaitEntered(t testing.TB, n int) []string {
	t.Helper()
	var got []string
	timeout := time.After(IOTimeout)
	for len(got) < n {
		select {
		case id := <-ft.entered:
			got = append(got, id)
		case <-timeout:
			t.Fatalf("only %d of %d calls reached the target", len(got), n)
		}
	}
	return got
}

// AnswerCode answers HTTP 200 with a target protocol body of code and msg.
func AnswerCode(code, msg string) Answer {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		_, _ = io.WriteString(w, `{"code":"`+code+`","message":"`+msg+`"}`)
	}
}

// AnswerStatus answers with the HTTP status and the body of a target
// failure, {"code":"E500","message":"injected"}.
func AnswerStatus(status int) Answer {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"code":"E500","message":"injected"}`)
	}
}

// Echo is an Answer: 0000 with the message "got <payload>".
func Echo(w http.ResponseWriter, _ *http.Request, payload []byte) {
	_, _ = io.WriteString(w, `{"code":"0000","message":"got `+string(payload)+`"}`)
}
