package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
)

func TestConnectCommandEndToEnd(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})

	out, _, code, err := run(t, "connect", "--addr", f.Addr, "--workers", "2", "--duration", "100ms", "--json")

	require.NoError(t, err, out)
	assert.Equal(t, 0, code)
	var sum loadgen.ConnectSummary
	require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
	assert.Positive(t, sum.Connections)
	assert.Equal(t, sum.Connections, f.Lines(), "one line per connection")
	assert.False(t, sum.TLS)
}

func TestConnectCommandRefusesResumeWithoutTLS(t *testing.T) {
	_, _, err := parse(t, "connect", "--resume")
	assert.ErrorContains(t, err, "--resume: needs --tls")
	_, _, err = parse(t, "connect", "--workers", "0")
	assert.ErrorContains(t, err, "--workers 0")
}
