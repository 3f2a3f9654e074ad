package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// statusCmd is `relayctl status`: its flags, filled by kong. Not for
// concurrent use.
type statusCmd struct {
	AdminFlags `embed:""`

	JSON bool `name:"json" help:"Print the admin endpoint's JSON as it is." env:"RELAYCTL_JSON"`
}

// hubStatus is the JSON of GET /status; unknown fields are ignored. A plain
// value.
type hubStatus struct {
	Draining   bool           `json:"draining"`
	Goroutines int            `json:"goroutines"`
	Targets    []targetStatus `json:"targets"`
	// Fleet is present when the hub runs in a fleet (--state-store).
	Fleet *struct {
		HubID          string `json:"hub_id"`
		StoreConnected bool   `json:"store_connected"`
	} `json:"fleet"`
}

// targetStatus is one target of hubStatus, a plain value.
type targetStatus struct {
	Name                string  `json:"name"`
	URL                 string  `json:"url"`
	State               string  `json:"state"`
	ConsecutiveFailures int64   `json:"consecutive_failures"`
	Inflight            int64   `json:"inflight"`
	MaxInflight         int64   `json:"max_inflight"`
	RetryAfterSeconds   float64 `json:"retry_after_seconds"`
	// Held and Disabled are an operator's doing (relayctl breaker): held
	// open, or pass-through.
	Held     bool `json:"held"`
	Disabled bool `json:"disabled"`
	// LastProbe is the hub's latest synthetic probe of the target, present
	// once it has sent one.
	LastProbe *struct {
		TxID            string  `json:"txid"`
		At              string  `json:"at"`
		Outcome         string  `json:"outcome"`
		Code            string  `json:"code"`
		DurationSeconds float64 `json:"duration_seconds"`
	} `json:"last_probe"`
	// Fleet is the target's shared state, present in a fleet.
	Fleet *struct {
		Epoch    int64  `json:"epoch"`
		OpenedBy string `json:"opened_by"`
		Source   string `json:"source"`
		Alone    bool   `json:"alone"`
	} `json:"fleet"`
}

// Validate checks what the tags cannot.
func (c *statusCmd) Validate() error { return c.validate() }

// Run fetches the hub's status and prints it. Exit status 2 when the admin
// endpoint cannot be asked (a TLS or token file it cannot use, the port
// unreachable), 1 when its answer is not a status.
func (c *statusCmd) Run(ctx context.Context, s *streams) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	ans, err := client.do(ctx, http.MethodGet, "/status", nil)
	if err != nil {
		return err
	}
	if ans.status != http.StatusOK {
		return client.refused(ans)
	}
	var st hubStatus
	if err := json.Unmarshal(ans.body, &st); err != nil {
		return fmt.Errorf("GET %s: not a status document: %w", ans.url, err)
	}
	if c.JSON {
		return writeRaw(s.Out, ans.body)
	}
	return writeStatus(s.Out, st)
}

// writeStatus prints the status as a table, a line per target the hub has
// sent a synthetic probe to, then one line about the hub.
// A hub in a fleet gets the columns of each target's shared state and its
// place in the fleet on the last line.
func writeStatus(w io.Writer, st hubStatus) error {
	if err := writeTargets(w, st.Targets, st.Fleet != nil); err != nil {
		return err
	}
	for _, t := range st.Targets {
		if p := t.LastProbe; p != nil {
			d := time.Duration(p.DurationSeconds * float64(time.Second)).Round(time.Microsecond)
			fmt.Fprintf(w, "%s last synthetic probe: %s %s in %s at %s (%s)\n", t.Name, p.Outcome, p.Code, d, p.At, p.TxID)
		}
	}
	state := "accepting"
	if st.Draining {
		state = "draining"
	}
	fleet := ""
	if st.Fleet != nil {
		store := "store connected"
		if !st.Fleet.StoreConnected {
			store = "store unreachable: breakers decide alone"
			if alone, shared := countAlone(st.Targets); alone > 0 && alone < shared {
				store = fmt.Sprintf("store unreachable for %d of %d targets: their breakers decide alone", alone, shared)
			}
		}
		fleet = fmt.Sprintf("; fleet hub %s, %s", st.Fleet.HubID, store)
	}
	_, err := fmt.Fprintf(w, "hub %s, %d goroutines%s\n", state, st.Goroutines, fleet)
	return err
}

// countAlone counts the targets the fleet shares, and those of them whose
// breakers decide alone (the store does not answer for them).
func countAlone(targets []targetStatus) (alone, shared int) {
	for _, t := range targets {
		if t.Fleet != nil {
			shared++
			if t.Fleet.Alone {
				alone++
			}
		}
	}
	return alone, shared
}

// writeTargets prints targets as a table, a line each, with the columns
// of each target's shared state when fleet is set (a hub in a fleet).
func writeTargets(w io.Writer, targets []targetStatus, fleet bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fleetCols := ""
	if fleet {
		fleetCols = "EPOCH\tOPENED-BY\tSOURCE\t"
	}
	fmt.Fprintln(tw, "TARGET\tSTATE\tFAILURES\tINFLIGHT/LIMIT\tRETRY-AFTER\t"+fleetCols+"URL")
	for _, t := range targets {
		fleetCells := ""
		if fleet && t.Fleet != nil {
			source := orDash(t.Fleet.Source)
			if t.Fleet.Alone {
				source = "alone"
			}
			fleetCells = fmt.Sprintf("%d\t%s\t%s\t", t.Fleet.Epoch, orDash(t.Fleet.OpenedBy), source)
		} else if fleet {
			fleetCells = "-\t-\t-\t"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%s\t%s%s\n",
			t.Name, stateCell(t), t.ConsecutiveFailures, t.Inflight, t.MaxInflight,
			formatRetryAfter(t.RetryAfterSeconds), fleetCells, t.URL)
	}
	return tw.Flush()
}

// stateCell is a target's breaker state in the table, with an operator's
// hold or disable.
func stateCell(t targetStatus) string {
	switch {
	case t.Held:
		return t.State + " (held)"
	case t.Disabled:
		return t.State + " (disabled)"
	}
	return t.State
}

// orDash returns s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// formatRetryAfter prints the wait before a probe is allowed to the
// millisecond, "7s" or "1.25s"; "-" when none is pending.
func formatRetryAfter(sec float64) string {
	if !(sec > 0) {
		return "-"
	}
	d := time.Duration(sec * float64(time.Second)).Round(time.Millisecond)
	if d == 0 {
		return "0s"
	}
	return d.String()
}

// firstLine returns the start of an error body for a message: its first
// line, at most 200 bytes.
func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strconv.Quote(s)
}
