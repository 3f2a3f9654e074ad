package protocol

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// validTxIDs returns TXIDs that ParseRequest accepts: the shortest, the
// longest, every byte of the alphabet, and random ones.
func validTxIDs(t *testing.T) [][]byte {
	var alphabet []byte
	for c := range 256 {
		if txidByte[c] {
			alphabet = append(alphabet, byte(c))
		}
	}
	ids := [][]byte{[]byte("T"), []byte(strings.Repeat("9", MaxTxIDLen)), []byte("TX-000123"), []byte("a.b_c:d-e")}
	for i := 0; i < len(alphabet); i += MaxTxIDLen {
		ids = append(ids, alphabet[i:min(i+MaxTxIDLen, len(alphabet))])
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		id := make([]byte, 1+r.IntN(MaxTxIDLen))
		for i := range id {
			id[i] = alphabet[r.IntN(len(alphabet))]
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		req, err := ParseRequest(append(append([]byte(nil), id...), "|CORE|x"...))
		require.NoError(t, err)
		require.Equal(t, string(id), string(req.TxID))
	}
	return ids
}

func TestAppendRetryAnswerIsTheResponse(t *testing.T) {
	secs := []int64{1, 2, 9, 10, 11, 59, 60, 99, 100, 101, 999, 1000, 3600, 86400, 1e9, math.MaxInt64}
	for _, id := range validTxIDs(t) {
		for _, s := range secs {
			want := AppendResponse([]byte("prefix:"), id, CodeCircuitOpen, AppendRetryHint(nil, s))
			assert.Equal(t, string(want), string(AppendRetryAnswer([]byte("prefix:"), id, s)), "txid %q secs %d", id, s)
		}
	}
}

func TestTailAppendAnswerIsTheResponse(t *testing.T) {
	msgs := []string{MsgBulkheadFull, MsgUnknownTarget, "", "a\r\nb\x00|c\x7f", strings.Repeat("€", MaxMessageBytes)}
	for _, id := range validTxIDs(t) {
		for _, msg := range msgs {
			tail := NewTail(CodeBulkheadFull, msg)
			want := AppendResponse([]byte("prefix:"), id, CodeBulkheadFull, msg)
			assert.Equal(t, string(want), string(tail.AppendAnswer([]byte("prefix:"), id)), "txid %q msg %q", id, msg)
		}
	}
}
