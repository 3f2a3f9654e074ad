package fleet

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseMessage(t *testing.T) {
	good := message{target: "CORE", epoch: 7, kind: "open", hub: "hub-a:9200", stamp: 1764600000000000}
	got, err := parseMessage(good.format())
	require.NoError(t, err)
	assert.Equal(t, good, got)
	assert.Equal(t, "v1|CORE|7|open|hub-a:9200|1764600000000000", good.format())

	for _, kind := range []string{"close", "operator-open", "operator-close", "operator-disable", "operator-enable"} {
		_, err := parseMessage("v1|CORE|1|" + kind + "|a|0")
		assert.NoError(t, err, kind)
	}

	tests := []struct{ name, msg string }{
		{"empty", ""},
		{"not ours", "hello"},
		{"other version", "v2|CORE|7|open|a|1"},
		{"too few fields", "v1|CORE|7|open|a"},
		{"too many fields", "v1|CORE|7|open|a|1|x"},
		{"epoch not a number", "v1|CORE|x|open|a|1"},
		{"epoch zero", "v1|CORE|0|open|a|1"},
		{"epoch negative", "v1|CORE|-3|open|a|1"},
		{"epoch overflows", "v1|CORE|99999999999999999999|open|a|1"},
		{"unknown kind", "v1|CORE|7|explode|a|1"},
		{"bad hub", "v1|CORE|7|open|bad hub|1"},
		{"empty hub", "v1|CORE|7|open||1"},
		{"bad target", "v1|CO{RE|7|open|a|1"},
		{"stamp negative", "v1|CORE|7|open|a|-1"},
		{"too long", "v1|CORE|7|open|a|1" + strings.Repeat("0", maxMessageBytes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseMessage(tt.msg)
			assert.ErrorIs(t, err, errBadMessage)
		})
	}
}

func FuzzParseMessage(f *testing.F) {
	f.Add("v1|CORE|7|open|hub-a:9200|1764600000000000")
	f.Add("v1|CORE|1|operator-enable|a|0")
	f.Add("v1|||||")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseMessage(s)
		if err != nil {
			return
		}
		// What parses is a message of the fleet, and reads back the same.
		assert.True(t, ValidName(m.target) && ValidName(m.hub) && m.epoch > 0 && messageKinds[m.kind])
		again, err := parseMessage(m.format())
		require.NoError(t, err)
		assert.Equal(t, m, again)
	})
}

func TestDecodeState(t *testing.T) {
	reply := []any{int64(1), int64(250), int64(7), "open", int64(1), int64(6), "hub-a", "results", int64(10000), int64(4000), int64(0), int64(0), "hub-b"}
	st, err := decodeState(reply)
	require.NoError(t, err)
	assert.Equal(t, storeState{
		code: 1, wait: 250e6, epoch: 7, bad: "open", open: true, recEpoch: 6, openedBy: "hub-a", reason: "results",
		period: 10e9, remaining: 4e9, holder: "hub-b",
	}, st)
	assert.Equal(t, []string{"open"}, splitBad(st.bad))
	assert.Nil(t, splitBad(""))

	for _, bad := range []any{
		nil, "OK", int64(1), []any{}, reply[:12],
		append(append([]any{}, reply[:2]...), append([]any{"7"}, reply[3:]...)...),
		append(append([]any{}, reply[:3]...), append([]any{int64(1)}, reply[4:]...)...),
		append(append([]any{}, reply[:12]...), int64(3)),
	} {
		_, err := decodeState(bad)
		assert.ErrorIs(t, err, errBadReply, "%v", bad)
	}
}

func TestNewClient(t *testing.T) {
	tests := []struct {
		name, url string
		want      string // the client's type, or the error's text
	}{
		{"one server", "redis://127.0.0.1:6379/0", "*redis.Client"},
		{"with password", "redis://user:secret@127.0.0.1:6379/2?dial_timeout=2s", "*redis.Client"},
		{"tls", "rediss://redis.bank:6380", "*redis.Client"},
		{"sentinel", "redis://127.0.0.1:26379?master_name=relay&addr=127.0.0.1:26380", "*redis.Client (sentinel)"},
		{"cluster", "redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", "*redis.ClusterClient"},
		{"other scheme", "http://127.0.0.1:6379", `state store URL "http://127.0.0.1:6379": want redis:// or rediss://`},
		{"no host", "redis:///0", "want a host"},
		{"unknown option", "redis://127.0.0.1:6379?colour=blue", "colour"},
		{"bad db", "redis://127.0.0.1:6379/x", "invalid database"},
		{"password hidden", "redis://u:hunter2@127.0.0.1:6379?colour=blue", "u:xxxxx@"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := newClient(tt.url, DefaultOpTimeout)
			if strings.HasPrefix(tt.want, "*redis.") {
				require.NoError(t, err)
				name := typeName(c)
				if rc, ok := c.(*redis.Client); ok && rc.Options().Addr == "FailoverClient" {
					// go-redis's Sentinel client is a *redis.Client that
					// asks the sentinels for the master.
					name += " (sentinel)"
				}
				assert.Equal(t, tt.want, name)
				assert.NoError(t, c.Close())
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "hunter2")
		})
	}
}

func TestKeysShareOneSlot(t *testing.T) {
	assert.Equal(t, []string{"rh:{CORE}:open", "rh:{CORE}:epoch", "rh:{CORE}:probe", "rh:{CORE}:manual"}, keys("CORE"))
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }
