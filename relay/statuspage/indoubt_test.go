package statuspage

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/hubtest"
	"github.com/relayhub/relayhub/relay"
)

func TestPageShowsTheCallsInDoubt(t *testing.T) {
	// Given CORE answering what is not the target protocol, so that each
	// of its calls ends in doubt, and CLAIM never called,
	core := hubtest.NewTarget(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		_, _ = w.Write([]byte("<html>gateway</html>"))
	})
	h := startHub(t, relay.Target{Name: "CORE", URL: core.URL}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	p := newPage(h.config(t))

	// before any call, the header says none is in doubt and every row 0;
	body := get(p, http.MethodGet, "/").Body.String()
	hub, _ := wellFormed(t, body, "hub")
	assert.Contains(t, hub, "none in doubt")
	for _, id := range []string{"t-CORE-indoubt", "t-CLAIM-indoubt"} {
		cell, _ := wellFormed(t, body, id)
		assert.Equal(t, "0", cell, id)
	}
	p.publish(p.now())

	// when two CORE calls end in doubt,
	c := hubtest.Dial(t, h.addr)
	for _, line := range []string{"T1|CORE|x", "T2|CORE|x"} {
		require.Contains(t, c.RoundTrip(line), "; outcome unknown")
	}

	// then the next frame sends CORE's count and the header's total, and
	// nothing of CLAIM's,
	p.publish(p.now())
	delta := p.frame.delta
	assert.Contains(t, delta, `id="t-CORE-indoubt" class="num doubt"`)
	assert.NotContains(t, delta, `id="t-CLAIM-indoubt"`)
	assert.Contains(t, delta, "2 in doubt")

	// and the page shows them, each count linking to the list.
	body = get(p, http.MethodGet, "/").Body.String()
	hub, _ = wellFormed(t, body, "hub")
	assert.Contains(t, hub, "2 in doubt")
	cell, _ := wellFormed(t, body, "t-CORE-indoubt")
	assert.Equal(t, "2outcome unknown: list", cell)
	cell, _ = wellFormed(t, body, "t-CLAIM-indoubt")
	assert.Equal(t, "0", cell)
	assert.Contains(t, body, `<a class="badge indoubt some" href="in-doubt"`)
	assert.Contains(t, body, `<a class="sub" href="in-doubt"`)
}
