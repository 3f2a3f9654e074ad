package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/relay/indoubt"
)

// inDoubtCmd is `relayctl in-doubt`: its flags, filled by kong. Not for
// concurrent use.
type inDoubtCmd struct {
	Recent bool   `help:"List the hub's recent calls in doubt, settled or not (its last 1000), rather than the open ones." env:"RELAYCTL_RECENT"`
	Since  string `help:"With --recent (which it implies): only the calls that ended at or after this time, RFC 3339 (2026-12-01T17:30:00Z)." placeholder:"TIME" env:"RELAYCTL_SINCE"`
	JSON   bool   `name:"json" help:"Print the hub's answer as it is: {\"open\":[...]} with each entry's attempts and next attempt; with --recent, {\"in_doubt\":[...]} with each call in the in-doubt journal's form." env:"RELAYCTL_JSON"`

	AdminFlags `embed:""`
}

// inDoubtList is the JSON of GET /in-doubt. A plain value.
type inDoubtList struct {
	InDoubt []inDoubtCall `json:"in_doubt"`
}

// inDoubtCall is one call of inDoubtList, as the in-doubt journal has it;
// unknown fields are ignored. A plain value.
type inDoubtCall struct {
	Time      string `json:"time"`
	Hub       string `json:"hub"`
	TxID      string `json:"txid"`
	Target    string `json:"target"`
	URL       string `json:"url"`
	Code      string `json:"code"`
	Stage     string `json:"stage"`
	BytesSent int64  `json:"bytes_sent"`
}

// Validate checks what the tags cannot.
func (c *inDoubtCmd) Validate() error {
	if _, err := c.since(); err != nil {
		return err
	}
	return c.validate()
}

// since returns --since; the zero time when it is empty.
func (c *inDoubtCmd) since() (time.Time, error) {
	if c.Since == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, c.Since)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time such as 2026-12-01T17:30:00Z", c.Since)
	}
	return t, nil
}

// Run lists the hub's open calls in doubt, or with --recent its recent
// ones (the last 1000 it keeps in memory), oldest first. Exit status 1
// when the hub refuses or its answer is not such a list, 2 when it cannot
// be asked.
func (c *inDoubtCmd) Run(ctx context.Context, s *streams) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	since, err := c.since()
	if err != nil {
		return err
	}
	if !c.Recent && since.IsZero() {
		return c.runOpen(ctx, client, s)
	}
	path := "/in-doubt"
	if !since.IsZero() {
		path += "?" + url.Values{"since": {since.Format(time.RFC3339Nano)}}.Encode()
	}
	ans, err := client.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	if ans.status != http.StatusOK {
		return client.refused(ans)
	}
	var list inDoubtList
	if err := json.Unmarshal(ans.body, &list); err != nil || list.InDoubt == nil {
		return fmt.Errorf("GET %s: not a list of calls in doubt: %s", ans.url, firstLine(ans.body))
	}
	if c.JSON {
		return writeRaw(s.Out, ans.body)
	}
	return writeInDoubt(s.Out, list.InDoubt, since)
}

// writeInDoubt prints the calls as a table, a line each, then how many
// there are.
func writeInDoubt(w io.Writer, calls []inDoubtCall, since time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tTXID\tTARGET\tCODE\tSTAGE\tBYTES-SENT\tURL")
	for _, c := range calls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", c.Time, c.TxID, c.Target, c.Code, c.Stage, c.BytesSent, c.URL)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	n := fmt.Sprintf("%d %s in doubt", len(calls), plural(len(calls), "call", "calls"))
	if !since.IsZero() {
		n += " since " + since.UTC().Format(time.RFC3339Nano)
	}
	_, err := fmt.Fprintln(w, n)
	return err
}

// openList is the JSON of GET /in-doubt?open=1. A plain value.
type openList struct {
	Open []openEntry `json:"open"`
}

// openEntry is one entry of openList; unknown fields are ignored. A plain
// value.
type openEntry struct {
	TxID     string    `json:"txid"`
	Target   string    `json:"target"`
	Since    time.Time `json:"since"`
	Policy   string    `json:"policy"`
	Attempts int       `json:"attempts"`
	// Next is when the next attempt is due; nil for a manual entry.
	Next     *time.Time `json:"next_attempt"`
	InFlight bool       `json:"in_flight"`
}

// fetchOpen asks the hub for its open calls in doubt and returns them
// with the answer's body.
func fetchOpen(ctx context.Context, client *adminClient) (openList, []byte, error) {
	ans, err := client.do(ctx, http.MethodGet, "/in-doubt?open=1", nil)
	if err != nil {
		return openList{}, nil, err
	}
	if ans.status != http.StatusOK {
		return openList{}, nil, client.refused(ans)
	}
	var list openList
	if err := json.Unmarshal(ans.body, &list); err != nil || list.Open == nil {
		return openList{}, nil, cmdline.Exit(1, fmt.Errorf("GET %s: not a list of open calls in doubt: %s", ans.url, firstLine(ans.body)))
	}
	return list, ans.body, nil
}

// runOpen lists the hub's open calls in doubt.
func (c *inDoubtCmd) runOpen(ctx context.Context, client *adminClient, s *streams) error {
	list, body, err := fetchOpen(ctx, client)
	if err != nil {
		return err
	}
	if c.JSON {
		return writeRaw(s.Out, body)
	}
	return writeOpen(s.Out, list.Open, time.Now())
}

// writeOpen prints the open entries as a table, a line each, with their
// age and the wait for their next attempt at now, then how many there
// are; only the count when there are none.
func writeOpen(w io.Writer, open []openEntry, now time.Time) error {
	if len(open) == 0 {
		_, err := fmt.Fprintln(w, "0 open calls in doubt")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SINCE\tAGE\tTXID\tTARGET\tRESOLVE\tATTEMPTS\tNEXT")
	for _, e := range open {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", e.Since.UTC().Format(indoubt.TimeFormat),
			now.Sub(e.Since).Round(time.Second), e.TxID, e.Target, e.Policy, e.Attempts, nextText(e, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d open %s in doubt\n", len(open), plural(len(open), "call", "calls"))
	return err
}

// nextText says when e's next attempt is, at now.
func nextText(e openEntry, now time.Time) string {
	switch {
	case e.InFlight:
		return "under way"
	case e.Next == nil || e.Next.IsZero():
		return "operator (relayctl in-doubt resolve)"
	case !e.Next.After(now):
		return "due"
	}
	return "in " + e.Next.Sub(now).Round(100*time.Millisecond).String()
}
