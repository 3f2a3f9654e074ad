package loadgen

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTemplate(t *testing.T) {
	tests := []struct {
		name string
		tmpl string
		n    uint64
		conn int
		want string
	}{
		{"request number", "BAL {n}", 42, 3, "BAL 42"},
		{"connection number", "BAL ACC{conn}", 42, 3, "BAL ACC3"},
		{"both, twice", "XFER A{conn} B{n} {n}", 7, 12, "XFER A12 B7 7"},
		{"no placeholder", "BAL ACC1", 1, 1, "BAL ACC1"},
		{"empty", "", 1, 1, ""},
		{"other braces are literal", "{x} {n {n}} {", 5, 1, "{x} {n 5} {"},
		{"placeholder at both ends", "{n}{conn}", 10, 2, "102"},
		{"separators pass through", "a|b {n}", 1, 1, "a|b 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := ParseTemplate(tt.tmpl)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(tmpl.AppendTo([]byte(nil), tt.n, tt.conn)))
		})
	}
}

func TestTemplateAppendsToExistingBytes(t *testing.T) {
	tmpl, err := ParseTemplate("BAL {n}")
	require.NoError(t, err)
	assert.Equal(t, "L1-1|CORE|BAL 9", string(tmpl.AppendTo([]byte("L1-1|CORE|"), 9, 1)))
}

func TestTemplateRejectsLineBreak(t *testing.T) {
	for _, bad := range []string{"BAL\n{n}", "BAL {n}\r"} {
		_, err := ParseTemplate(bad)
		assert.ErrorContains(t, err, "line break")
	}
}

func TestTemplateAppendDoesNotAllocate(t *testing.T) {
	tmpl, err := ParseTemplate("XFER A{conn} B{n} 100")
	require.NoError(t, err)
	buf := make([]byte, 0, 128)
	allocs := testing.AllocsPerRun(100, func() {
		buf = tmpl.AppendTo(buf[:0], 123456, 7)
	})
	assert.Zero(t, allocs)
}
