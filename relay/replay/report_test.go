package replay

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
)

// compared replays the incident, one bad line and a CLAIM call with the
// hub's settings and with a threshold of 5.
func compared(t *testing.T) *Report {
	in := append(append([]string{}, incident...), "junk", callLine("CLAIM", 2200, 4, "B211", false))
	return run(t, []Source{textSource("access.log", in...)},
		settings("replay", hubPolicy), settings("compare", breaker.Policy{FailThreshold: 5, ResetTimeout: time.Second}))
}

func TestReportText(t *testing.T) {
	// testdata/report.txt is what docs/OPERATING.md shows of the report.
	var out strings.Builder
	require.NoError(t, compared(t).WriteText(&out, "core"))
	want, err := os.ReadFile(filepath.Join("testdata", "report.txt"))
	require.NoError(t, err)
	assert.Equal(t, string(want), out.String())
}

func TestReportJSON(t *testing.T) {
	rep := compared(t)
	var out strings.Builder
	require.NoError(t, rep.WriteJSON(&out, ""))
	var got struct {
		Lines          int64       `json:"lines"`
		MalformedLines []LineError `json:"malformed_lines"`
		LateLines      []LineError `json:"late_lines"`
		Logged         []struct {
			Target string `json:"target"`
		} `json:"logged"`
		Sets []struct {
			Name        string           `json:"name"`
			Settings    []TargetSettings `json:"settings"`
			Transitions []string         `json:"transitions"`
			Targets     []map[string]any `json:"targets"`
		} `json:"sets"`
	}
	require.NoError(t, json.Unmarshal([]byte(out.String()), &got))
	assert.Equal(t, int64(13), got.Lines)
	assert.Equal(t, []LineError{{Source: "access.log", Line: 12, Reason: "not JSON"}}, got.MalformedLines)
	assert.NotNil(t, got.LateLines, "an empty list, not null")
	require.Len(t, got.Sets, 2)
	assert.Equal(t, "compare", got.Sets[1].Name)
	assert.Equal(t, []string{
		"2026-11-30T08:00:00.601Z|CORE|CLOSED->OPEN",
		"2026-11-30T08:00:02.000Z|CORE|OPEN->HALF_OPEN",
		"2026-11-30T08:00:02.002Z|CORE|HALF_OPEN->OPEN",
	}, got.Sets[1].Transitions)
	assert.Contains(t, out.String(), "CLOSED->OPEN", "transitions are not HTML-escaped")
	require.Len(t, got.Sets[1].Targets, 2)
	assert.Equal(t, map[string]any{"target": "CORE", "requests": 11.0, "calls": 7.0, "failed": 6.0, "inferred": 3.0,
		"refused": 4.0, "handed_back": 0.0, "to_fallback": 0.0, "probes": 1.0, "opened": 2.0, "not_closed_seconds": 1.603},
		got.Sets[1].Targets[0])
	assert.Equal(t, "CLAIM", got.Sets[1].Targets[1]["target"])
	assert.Equal(t, 1.0, got.Sets[1].Targets[1]["calls"])
	assert.Equal(t, "CORE", got.Logged[0].Target)
	assert.Equal(t, "CLAIM", got.Logged[1].Target)

	// One target only:
	out.Reset()
	require.NoError(t, rep.WriteJSON(&out, "CLAIM"))
	got.Logged, got.Sets = nil, nil
	require.NoError(t, json.Unmarshal([]byte(out.String()), &got))
	require.Len(t, got.Logged, 1)
	assert.Empty(t, got.Sets[0].Transitions)
	assert.NotNil(t, got.Sets[0].Transitions, "an empty list, not null")
	assert.Equal(t, []TargetSettings{{Target: "CLAIM", Settings: "fail_threshold=3 reset_timeout=1s target_timeout=3s failure_codes=E500,E901,E902"}},
		got.Sets[0].Settings)
}
