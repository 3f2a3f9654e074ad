package reconcile

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// fastLines are journal lines as hubs write them and as people or tools
// may mangle them.
var fastLines = []string{
	`{"time":"2026-12-01T17:30:00.123Z","hub":"hub-a:9200","txid":"T1","target":"CORE","url":"http://127.0.0.1:9201","code":"E901","stage":"request_sent","bytes_sent":123,"payload_sha256":"ab"}`,
	`{"time":"2026-12-01T17:31:05.250Z","hub":"hub-b","txid":"T1","target":"CORE","url":"http://h:1","code":"0000","stage":"resolved_applied","bytes_sent":0,"payload_sha256":"ab","via":"lookup"}`,
	`{"time":"2026-12-01T18:30:00+01:00","txid":"T\u00e9\n","target":"CORE","url":"http://h:1"}`,
	`{"TXID":"T1","target":"CORE","url":"http://h:1"}`,
	`{"txid":"T1","txid":"T2","target":"CORE","url":"http://h:1"}`,
	`{"txid":"T1","target":"CORE","url":"http://h:1","bytes_sent":1.5}`,
	`{"txid":"T1","target":"CORE","url":"http://h:1","bytes_sent":"12"}`,
	`{"txid":"T1","target":"CORE","url":"http://h:1","time":null,"hub":null}`,
	`{"txid":"T1","target":"CORE","url":"http://h:1","time":"yesterday"}`,
	`{"txid":"T1","target":"CORE","url":"http://h:1","extra":{"a":[1,2]}}`,
	"{\"txid\":\"T\xff1\",\"target\":\"CORE\",\"url\":\"http://h:1\"}",
	`{"txid":"T1","target":"CORE","url":"http://h:1","line":7,"file":"in-doubt.log.1"}`,
	`["txid"]`,
	`{"txid":"T1"`,
	`null`,
}

// TestFastEntryIsUnmarshal: whatever fastEntry reads, it reads as
// json.Unmarshal does.
func TestFastEntryIsUnmarshal(t *testing.T) {
	for _, line := range fastLines {
		checkFastEntry(t, line)
	}
	fast := 0
	for _, line := range fastLines[:3] {
		if _, ok := fastEntry([]byte(line), &interner{m: map[string]string{}}); ok {
			fast++
		}
	}
	assert.Equal(t, 3, fast, "the hub's own lines take the fast way")
}

func FuzzFastEntryIsUnmarshal(f *testing.F) {
	for _, line := range fastLines {
		f.Add(line)
	}
	f.Fuzz(func(t *testing.T, line string) { checkFastEntry(t, line) })
}

func checkFastEntry(t *testing.T, line string) {
	t.Helper()
	got, ok := fastEntry([]byte(line), &interner{m: map[string]string{}})
	if !ok {
		return
	}
	var want Entry
	if err := json.Unmarshal([]byte(line), &want); err != nil {
		t.Fatalf("fastEntry read %q, which json refuses: %v", line, err)
	}
	if !got.Time.Equal(want.Time) {
		t.Fatalf("%q: time %v, json %v", line, got.Time, want.Time)
	}
	got.Time = want.Time
	assert.Equal(t, want, got, line)
}
