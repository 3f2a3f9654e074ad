package fleet

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/dedup"
)

func TestTxRecordFormat(t *testing.T) {
	h := dedup.HashPayload([]byte("pay 10"))
	hash := hex.EncodeToString(h[:])
	tests := []struct {
		rec  dedup.Record
		want string
	}{
		{dedup.Record{State: dedup.InFlight, Hash: h, Hub: "hub-a:9200"}, "1|F|" + hash + "|hub-a:9200||"},
		{dedup.Record{State: dedup.Answered, Hash: h, Hub: "a", Code: "0000", Message: "balance=10|EUR"}, "1|A|" + hash + "|a|0000|balance=10|EUR"},
		{dedup.Record{State: dedup.InDoubt, Hash: h, Hub: "a", Code: "E901", Message: "délai dépassé"}, "1|D|" + hash + "|a|E901|délai dépassé"},
		{dedup.Record{State: dedup.Answered, Hash: h, Hub: "a", Code: "B042"}, "1|A|" + hash + "|a|B042|"},
	}
	for _, tt := range tests {
		t.Run(tt.rec.State.String()+" "+tt.rec.Code, func(t *testing.T) {
			b, err := appendTxRecord(nil, tt.rec)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(b))
			rec, err := decodeTxRecord(string(b))
			require.NoError(t, err)
			assert.Equal(t, tt.rec, rec)
		})
	}

	for _, bad := range []string{
		"1|A|" + hash + "|a|0000|two\nlines",
		"1|A|" + hash + "|a|0000|" + strings.Repeat("x", maxTxValueBytes),
		"1|F|" + hash + "|a|",
		"1|F|" + hash + "|a|||",
	} {
		_, err := decodeTxRecord(bad)
		assert.ErrorIs(t, err, ErrBadDedupRecord, "%q", bad)
	}
}

func FuzzDecodeTxRecord(f *testing.F) {
	hash := strings.Repeat("0f", 16)
	f.Add("1|F|" + hash + "|a||")
	f.Add("1|A|" + hash + "|hub-a:9200|0000|ok|still the message")
	f.Add("1|D|" + hash + "|a|E901|")
	f.Add("1|||||")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, s string) {
		rec, err := decodeTxRecord(s)
		if err != nil {
			return
		}
		// What decodes is a record of the fleet, and is written back the
		// same.
		b, err := appendTxRecord(nil, rec)
		require.NoError(t, err)
		assert.Equal(t, s, string(b))
	})
}
