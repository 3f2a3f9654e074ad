package targethttp

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lateTarget is a raw target that reads one request, writes first at once
// (if any), then writes answer once release is closed, and then reports on
// closed when the hub closed the connection.
type lateTarget struct {
	url     string
	release chan struct{}
	closed  chan struct{}
}

func newLateTarget(t *testing.T, first, answer string) *lateTarget {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	lt := &lateTarget{url: "http://" + ln.Addr().String(), release: make(chan struct{}), closed: make(chan struct{})}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		if _, err := c.Read(buf); err != nil {
			return
		}
		_, _ = io.WriteString(c, first)
		eof := make(chan struct{})
		go func() {
			defer close(eof)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
		select {
		case <-lt.release:
			_, _ = io.WriteString(c, answer)
			<-eof
		case <-eof:
		}
		close(lt.closed)
	}()
	return lt
}

const lateOK = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 34\r\n\r\n{\"code\":\"0000\",\"message\":\"booked\"}"

// closedWithin reports whether the target saw the hub close the
// connection within d.
func (lt *lateTarget) closedWithin(d time.Duration) bool {
	select {
	case <-lt.closed:
		return true
	case <-time.After(d):
		return false
	}
}

func TestLateAnswerIsDelivered(t *testing.T) {
	// Given a target that answers only after the call's timeout, and a
	// client that reads on for a grace
	lt := newLateTarget(t, "", lateOK)
	answers := make(chan LateAnswer, 1)
	tg := testTargetWith(t, Config{URL: lt.url, Timeout: 100 * time.Millisecond, LateAnswerGrace: 5 * time.Second,
		OnLateAnswer: func(a LateAnswer) { answers <- a }})

	// When the call times out
	res := tg.Call([]byte("W1"), []byte("WD ACC1 500"))

	// Then the client gets E901 in doubt, and the connection is kept
	assert.Equal(t, "E901", res.Code)
	assert.Equal(t, Sent, res.Stage)
	assert.True(t, res.LateRead)
	assert.False(t, lt.closedWithin(50*time.Millisecond), "kept open for the grace")

	// And when the target answers, the answer is delivered, then the
	// connection closed
	close(lt.release)
	select {
	case a := <-answers:
		assert.Equal(t, "W1", a.TxID)
		assert.Equal(t, "0000", a.Code)
		assert.Equal(t, "booked", string(a.Msg))
		assert.False(t, a.At.IsZero())
	case <-time.After(5 * time.Second):
		t.Fatal("no late answer delivered")
	}
	assert.True(t, lt.closedWithin(5*time.Second))
	tg.conns.WaitLate()
}

func TestLateAnswerNotDelivered(t *testing.T) {
	tests := []struct {
		name     string
		first    string // written at once
		answer   string // written on release
		grace    time.Duration
		release  bool
		lateRead bool
		stage    Stage
	}{
		{name: "late reading off", answer: lateOK, lateRead: false, stage: Sent},
		{name: "no answer within the grace", answer: lateOK, grace: 100 * time.Millisecond, lateRead: true, stage: Sent},
		{name: "a late answer not in the target protocol", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", grace: 5 * time.Second, release: true, lateRead: true, stage: Sent},
		{name: "a late answer cut short", answer: "HTTP/1.1 200 OK\r\nContent-Length: 35\r\n\r\n{\"code\"", grace: 200 * time.Millisecond, release: true, lateRead: true, stage: Sent},
		{name: "part of the answer read before the timeout", first: "HTTP/1.1 200 OK\r\n", answer: lateOK, grace: 5 * time.Second, lateRead: false, stage: AnswerPartlyRead},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lt := newLateTarget(t, tt.first, tt.answer)
			delivered := make(chan LateAnswer, 1)
			tg := testTargetWith(t, Config{URL: lt.url, Timeout: 100 * time.Millisecond, LateAnswerGrace: tt.grace,
				OnLateAnswer: func(a LateAnswer) { delivered <- a }})

			res := tg.Call([]byte("W1"), []byte("WD ACC1 500"))
			assert.Equal(t, "E901", res.Code)
			assert.Equal(t, tt.stage, res.Stage)
			assert.Equal(t, tt.lateRead, res.LateRead)
			if tt.release {
				close(lt.release)
			}
			assert.True(t, lt.closedWithin(5*time.Second), "closed at the timeout, the grace's end, or the answer")
			tg.conns.WaitLate()
			assert.Empty(t, delivered)
		})
	}
}

func TestAbortEndsLateReads(t *testing.T) {
	lt := newLateTarget(t, "", lateOK)
	tg := testTargetWith(t, Config{URL: lt.url, Timeout: 100 * time.Millisecond, LateAnswerGrace: time.Hour,
		OnLateAnswer: func(LateAnswer) { t.Error("delivered after Abort") }})
	res := tg.Call([]byte("W1"), []byte("WD ACC1 500"))
	require.True(t, res.LateRead)

	tg.conns.Abort()
	done := make(chan struct{})
	go func() { tg.conns.WaitLate(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a late reader outlived Abort")
	}
	assert.True(t, lt.closedWithin(5*time.Second))
}

func TestNewRejectsANegativeGrace(t *testing.T) {
	_, err := New(Config{URL: "http://127.0.0.1:1/tx", Timeout: time.Second, MaxInflight: 1, Conns: NewConns(nil), LateAnswerGrace: -time.Second})
	assert.ErrorContains(t, err, "LateAnswerGrace must not be negative")
}

func TestLateReadsAreBoundedByMaxInflight(t *testing.T) {
	// Given a target that reads every request and never answers, and a
	// client of bulkhead size 2 that reads on for a long grace
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	tg := testTargetWith(t, Config{URL: "http://" + ln.Addr().String(), Timeout: 50 * time.Millisecond,
		MaxInflight: 2, LateAnswerGrace: time.Minute, OnLateAnswer: func(LateAnswer) {}})
	t.Cleanup(func() { tg.conns.Abort(); tg.conns.WaitLate() })

	// When three calls time out one after another
	var late []bool
	for _, txid := range []string{"W1", "W2", "W3"} {
		res := tg.Call([]byte(txid), []byte("BAL 1001"))
		require.Equal(t, "E901", res.Code)
		late = append(late, res.LateRead)
	}

	// Then two connections are read on, and the third is closed at once
	assert.Equal(t, []bool{true, true, false}, late)
}
