package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// maxStatusBytes bounds the admin answer read, so a wrong address serving
// something huge cannot exhaust memory.
const maxStatusBytes = 4 << 20

// statusCmd is `relayctl status`: its flags, filled by kong. Not for
// concurrent use.
type statusCmd struct {
	Admin   string        `help:"Hub admin address, host:port (or a base URL)." default:"127.0.0.1:9280" env:"RELAYCTL_ADMIN"`
	Timeout time.Duration `help:"Limit on the whole request." default:"5s" env:"RELAYCTL_TIMEOUT"`
	JSON    bool          `name:"json" help:"Print the admin endpoint's JSON as it is." env:"RELAYCTL_JSON"`
	Token   string        `name:"admin-token" help:"Bearer token of the admin port (the hub's --admin-token), which reads from beyond loopback need. Prefer the environment variable." env:"RELAYCTL_ADMIN_TOKEN"`

	loadgen.TLSFlags `embed:"" envprefix:"RELAYCTL_"`
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
	} `json:"fleet"`
}

// Validate checks what the tags cannot.
func (c *statusCmd) Validate() error {
	if c.Timeout <= 0 {
		return fmt.Errorf("--timeout %s: want more than 0", c.Timeout)
	}
	return nil
}

// Run fetches the hub's status and prints it. Exit status 2 when the admin
// endpoint cannot be reached, 1 when its answer is not a status.
func (c *statusCmd) Run(ctx context.Context, s *streams) error {
	tlsConfig, err := c.ClientConfig()
	if err != nil {
		return err
	}
	url, err := statusURL(c.Admin, tlsConfig != nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("--admin %q: %w", c.Admin, err)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Do(req)
	if err != nil {
		// *url.Error repeats the method and URL this message already has.
		if ue, ok := errors.AsType[*neturl.Error](err); ok {
			err = ue.Err
		}
		return cmdline.Exit(2, fmt.Errorf("GET %s: %w", url, err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxStatusBytes))
	if err != nil {
		return cmdline.Exit(2, fmt.Errorf("GET %s: read body: %w", url, err))
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, firstLine(body))
	}
	var st hubStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("GET %s: not a status document: %w", url, err)
	}
	if c.JSON {
		if _, err := s.Out.Write(body); err != nil {
			return err
		}
		if len(body) > 0 && body[len(body)-1] != '\n' {
			_, err = io.WriteString(s.Out, "\n")
		}
		return err
	}
	return writeStatus(s.Out, st)
}

// statusURL builds the status URL from --admin, which is host:port or,
// for an admin port behind a proxy, a base URL; useTLS (--tls and its
// kin) makes host:port https, and refuses an http:// URL.
func statusURL(admin string, useTLS bool) (string, error) {
	switch {
	case strings.HasPrefix(admin, "http://") && useTLS:
		return "", fmt.Errorf("--admin %q: --tls wants https://", admin)
	case strings.HasPrefix(admin, "http://") || strings.HasPrefix(admin, "https://"):
		return strings.TrimSuffix(admin, "/") + "/status", nil
	case useTLS:
		return "https://" + admin + "/status", nil
	}
	return "http://" + admin + "/status", nil
}

// writeStatus prints the status as a table, a line per target the hub has
// sent a synthetic probe to, then one line about the hub.
// A hub in a fleet gets the columns of each target's shared state and its
// place in the fleet on the last line.
func writeStatus(w io.Writer, st hubStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fleetCols := ""
	if st.Fleet != nil {
		fleetCols = "EPOCH\tOPENED-BY\tSOURCE\t"
	}
	fmt.Fprintln(tw, "TARGET\tSTATE\tFAILURES\tINFLIGHT/LIMIT\tRETRY-AFTER\t"+fleetCols+"URL")
	for _, t := range st.Targets {
		fleetCells := ""
		if st.Fleet != nil && t.Fleet != nil {
			fleetCells = fmt.Sprintf("%d\t%s\t%s\t", t.Fleet.Epoch, orDash(t.Fleet.OpenedBy), orDash(t.Fleet.Source))
		} else if st.Fleet != nil {
			fleetCells = "-\t-\t-\t"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%s\t%s%s\n",
			t.Name, t.State, t.ConsecutiveFailures, t.Inflight, t.MaxInflight,
			formatRetryAfter(t.RetryAfterSeconds), fleetCells, t.URL)
	}
	if err := tw.Flush(); err != nil {
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
		}
		fleet = fmt.Sprintf("; fleet hub %s, %s", st.Fleet.HubID, store)
	}
	_, err := fmt.Fprintf(w, "hub %s, %d goroutines%s\n", state, st.Goroutines, fleet)
	return err
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
