package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
)

func TestStatusPageFlag(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		args []string
		want bool
	}{
		{name: "on by default", want: true},
		{name: "turned off", args: []string{"--no-status-page"}, want: false},
		{name: "turned off from the environment", env: []string{"RELAY_STATUS_PAGE=false"}, want: false},
		{name: "turned on explicitly", args: []string{"--status-page"}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parse(t, tt.env, tt.args...)
			require.NoError(t, err)
			assert.Equal(t, tt.want, c.StatusPage)
			assert.Equal(t, tt.want, statusPageRecorder(c) != nil)
		})
	}
	c, err := parse(t, nil, "--admin-listen", "")
	require.NoError(t, err)
	assert.Nil(t, statusPageRecorder(c), "no admin port, no page")
}

func TestAlsoObserveCallsBothInOrder(t *testing.T) {
	var got []string
	first := func(t breaker.Transition) { got = append(got, "log "+t.Name) }
	then := func(t breaker.Transition) { got = append(got, "page "+t.Name) }
	alsoObserve(first, then)(breaker.Transition{Name: "CORE"})
	alsoObserve(nil, then)(breaker.Transition{Name: "CLAIM"})
	assert.Equal(t, []string{"log CORE", "page CORE", "page CLAIM"}, got)
	assert.Nil(t, pageHandler(nil))
}
