package hubtest

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Event is one Server-Sent Event: its name (empty for none), its data
// lines joined by "\n", and its retry field, if any. It is a plain value.
type Event struct {
	Name, Data, Retry string
}

// EventStream is a Server-Sent Events stream opened by OpenEvents, read by
// a goroutine of its own. Next and Err belong on the test's goroutine.
type EventStream struct {
	events chan Event
	done   chan struct{} // closed when the stream has ended
	err    error         // why it ended, nil at a clean end; written before done is closed
}

// OpenEvents opens GET url as an event stream, failing the test unless it
// answers 200 with Content-Type text/event-stream. The stream is closed
// when the test ends.
func OpenEvents(t testing.TB, url string) *EventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	// No client timeout: the stream is meant to outlive any; Next bounds
	// each wait instead.
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", url, err)
	}
	s := &EventStream{events: make(chan Event, 64), done: make(chan struct{})}
	t.Cleanup(func() {
		cancel()
		resp.Body.Close()
		<-s.done
	})
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s", url)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	go s.read(resp.Body)
	return s
}

// read parses events from body until it ends.
func (s *EventStream) read(body io.Reader) {
	defer close(s.done)
	defer close(s.events)
	lines := bufio.NewScanner(body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	var ev Event
	var data []string
	for lines.Scan() {
		field, value, _ := strings.Cut(lines.Text(), ": ")
		switch field {
		case "":
			ev.Data = strings.Join(data, "\n")
			s.events <- ev
			ev, data = Event{}, nil
		case "event":
			ev.Name = value
		case "data":
			data = append(data, value)
		case "retry":
			ev.Retry = value
		}
	}
	s.err = lines.Err()
}

// Next returns the next event, or false once the stream has ended; it
// fails the test if neither happens within d.
func (s *EventStream) Next(t testing.TB, d time.Duration) (Event, bool) {
	t.Helper()
	select {
	case ev, ok := <-s.events:
		return ev, ok
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
		return Event{}, false
	}
}

// Err returns why the stream ended: nil when the server ended it cleanly.
// Call it once Next has returned false.
func (s *EventStream) Err() error {
	<-s.done
	return s.err
}
