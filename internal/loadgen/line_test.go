package loadgen

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/protocol"
)

func TestValidTargetAndPayload(t *testing.T) {
	assert.True(t, ValidTarget("CORE"))
	for _, bad := range []string{"", "CO|RE", "CO RE", "CORE\n", "\x7f"} {
		assert.False(t, ValidTarget(bad), "%q", bad)
	}
	assert.True(t, ValidPayload(""))
	assert.True(t, ValidPayload("XFER A|B 10"), "a payload may hold '|'")
	assert.False(t, ValidPayload("BAL A\nX|CORE|BAL B"))
	assert.False(t, ValidPayload("BAL A\r"))
}

func TestCodeSucceeded(t *testing.T) {
	tests := []struct {
		code string
		want bool
	}{
		{"0000", true},
		{"B201", true},
		{"B999", true},
		{"E400", false},
		{"E500", false},
		{"E904", false},
		{"B20", false},
		{"B2011", false},
		{"BXYZ", false},
		{"0001", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			assert.Equal(t, tt.want, CodeSucceeded([]byte(tt.code)))
		})
	}
}

func TestLoadTxIDRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		conn int
		seq  uint64
	}{{1, 1}, {16, 0}, {9999, 1 << 40}, {1, 18446744073709551} /* 17 digits */} {
		b := appendLoadTxID(nil, tc.conn, tc.seq)
		require.True(t, protocol.ValidTxID(b), "%s", b)
		conn, seq, ok := parseLoadTxID(b)
		require.True(t, ok, "%s", b)
		assert.Equal(t, tc.conn, conn)
		assert.Equal(t, tc.seq, seq)
	}
}

func TestParseLoadTxIDRejects(t *testing.T) {
	for _, bad := range []string{
		"", "-", "L", "L1", "L1-", "L-1", "X1-1", "l1-1", "L01-1", "L1-01", "L1-1x", "L1-1-1",
		"L1-99999999999999999999", "ctl-abc-0011", "nobody-1",
	} {
		t.Run(bad, func(t *testing.T) {
			_, _, ok := parseLoadTxID([]byte(bad))
			assert.False(t, ok)
		})
	}
}

func TestParseLoadTxIDDoesNotAllocate(t *testing.T) {
	txid := []byte("L12-345678")
	allocs := testing.AllocsPerRun(100, func() {
		_, _, _ = parseLoadTxID(txid)
		_, _ = protocol.ParseResponse([]byte("L12-345678|0000|ok\n"))
	})
	assert.Zero(t, allocs)
}
