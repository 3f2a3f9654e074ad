package hubtest_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
)

// post sends payload to ft as the hub sends a transaction, and returns the
// answer's status and body. It fails no test, so that a goroutine may call
// it.
func post(ft *hubtest.Target, txid, payload string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, ft.URL+"/tx", strings.NewReader(payload))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-Tx-Id", txid)
	resp, err := (&http.Client{Timeout: hubtest.IOTimeout}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestTargetAnswers(t *testing.T) {
	ft := hubtest.NewTarget(t, hubtest.Echo)
	tests := []struct {
		name   string
		answer hubtest.Answer
		status int
		body   string
	}{
		{name: "echo", answer: hubtest.Echo, status: 200, body: `{"code":"0000","message":"got BAL 1"}`},
		{name: "code", answer: hubtest.AnswerCode("B201", "insufficient funds"), status: 200, body: `{"code":"B201","message":"insufficient funds"}`},
		{name: "status", answer: hubtest.AnswerStatus(503), status: 503, body: `{"code":"E500","message":"injected"}`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ft.Set(tt.answer)
			status, body, err := post(ft, "T1", "BAL 1")
			require.NoError(t, err)
			assert.Equal(t, tt.status, status)
			assert.Equal(t, tt.body, body)
			assert.Equal(t, i+1, ft.Calls())
		})
	}
}

func TestTargetHoldsCallsUntilReleased(t *testing.T) {
	// Given a target that holds its calls,
	ft := hubtest.NewTarget(t, nil)
	ft.Set(ft.BlockThen(hubtest.Echo))

	// when two calls arrive, they are reported and held;
	answers := make(chan string, 2)
	var wg sync.WaitGroup
	for _, txid := range []string{"A", "B"} {
		wg.Go(func() {
			_, body, err := post(ft, txid, txid)
			assert.NoError(t, err)
			answers <- body
		})
	}
	assert.ElementsMatch(t, []string{"A", "B"}, ft.WaitEntered(t, 2))
	assert.Equal(t, 2, ft.Calls())
	assert.Empty(t, answers, "answered before UnblockAll")

	// then UnblockAll lets them, and every later call, through.
	ft.UnblockAll()
	wg.Wait()
	close(answers)
	var got []string
	for a := range answers {
		got = append(got, a)
	}
	assert.ElementsMatch(t, []string{`{"code":"0000","message":"got A"}`, `{"code":"0000","message":"got B"}`}, got)
	_, body, err := post(ft, "C", "C")
	require.NoError(t, err)
	assert.Equal(t, `{"code":"0000","message":"got C"}`, body)
}

// lineServer answers each line "TXID|..." with "TXID|0000|ok" and, after a
// line "bye", closes the connection.
func lineServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer nc.Close()
				sc := bufio.NewScanner(nc)
				for sc.Scan() && sc.Text() != "bye" {
					txid, _, _ := strings.Cut(sc.Text(), "|")
					if _, err := io.WriteString(nc, txid+"|0000|ok\n"); err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

func TestClient(t *testing.T) {
	c := hubtest.Dial(t, lineServer(t))
	assert.Equal(t, hubtest.Response{TxID: "A", Code: "0000", Message: "ok"}, c.Exchange("A|CORE|x"))
	c.Send("B|CORE|x", "C|CORE|x")
	assert.Equal(t, map[string]hubtest.Response{"B": {TxID: "B", Code: "0000", Message: "ok"}, "C": {TxID: "C", Code: "0000", Message: "ok"}},
		c.ReadByTxID(2))
	_, err := c.Write([]byte("D|CO"))
	require.NoError(t, err)
	c.Send("RE|x")
	line, err := c.ReadLine(hubtest.ClientTimeout)
	require.NoError(t, err)
	assert.Equal(t, "D|0000|ok\n", line)
	c.Send("bye")
	c.ExpectEOF()
}

func TestParseResponse(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    hubtest.Response
		wantErr bool
	}{
		{name: "plain", line: "tx1|0000|balance=99500\n", want: hubtest.Response{TxID: "tx1", Code: "0000", Message: "balance=99500"}},
		{name: "no newline", line: "tx1|B201|insufficient funds", want: hubtest.Response{TxID: "tx1", Code: "B201", Message: "insufficient funds"}},
		{name: "pipe in message", line: "tx1|0000|a|b||c\n", want: hubtest.Response{TxID: "tx1", Code: "0000", Message: "a|b||c"}},
		{name: "empty message", line: "-|E900|\n", want: hubtest.Response{TxID: "-", Code: "E900"}},
		{name: "two fields", line: "tx1|0000\n", wantErr: true},
		{name: "empty txid", line: "|0000|x\n", wantErr: true},
		{name: "empty code", line: "tx1||x\n", wantErr: true},
		{name: "carriage return", line: "tx1|0000|x\r\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := hubtest.ParseResponse(tt.line)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestMetricValueAndSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	moves := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "moves_total", Help: "h"}, []string{"target", "to"})
	state := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "state", Help: "h"}, []string{"target"})
	took := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "took_seconds", Help: "h"}, []string{"target"})
	reg.MustRegister(moves, state, took)
	moves.WithLabelValues("CORE", "OPEN").Add(2)
	moves.WithLabelValues("CORE", "CLOSED").Add(3)
	moves.WithLabelValues("CLAIM", "OPEN").Add(5)
	state.WithLabelValues("CORE").Set(2)
	took.WithLabelValues("CORE").Observe(0.1)
	took.WithLabelValues("CORE").Observe(0.2)

	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, "moves_total", "target", "CORE", "to", "OPEN"))
	assert.Equal(t, 5.0, hubtest.MetricValue(t, reg, "moves_total", "to", "OPEN", "target", "CLAIM"))
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, "state", "target", "CORE"))
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, "took_seconds", "target", "CORE"), "a histogram's sample count")
	assert.Equal(t, 5.0, hubtest.MetricSum(t, reg, "moves_total", "target", "CORE"))
	assert.Equal(t, 7.0, hubtest.MetricSum(t, reg, "moves_total", "to", "OPEN"))
	assert.Equal(t, 10.0, hubtest.MetricSum(t, reg, "moves_total"))
	assert.Zero(t, hubtest.MetricSum(t, reg, "moves_total", "target", "NOPE"))
}

func TestEventually(t *testing.T) {
	start := time.Now()
	n := 0
	hubtest.Eventually(t, func() bool { n++; return n == 3 }, "never")
	assert.Equal(t, 3, n, "polls until the condition holds, and no more")
	assert.Less(t, time.Since(start), hubtest.IOTimeout)
}

func ExampleTransitions() {
	var tr hubtest.Transitions
	at := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	tr.Observe(breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at})
	tr.Observe(breaker.Transition{Name: "CORE", From: breaker.Open, To: breaker.HalfOpen, At: at.Add(10 * time.Second)})
	fmt.Println(tr.List())
	// Output: [CORE:CLOSED->OPEN CORE:OPEN->HALF_OPEN]
}
