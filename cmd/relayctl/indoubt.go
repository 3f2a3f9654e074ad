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
)

// inDoubtCmd is `relayctl in-doubt`: its flags, filled by kong. Not for
// concurrent use.
type inDoubtCmd struct {
	Since string `help:"Only the calls that ended at or after this time, RFC 3339 (2026-12-01T17:30:00Z); empty means all the hub keeps (its last 1000)." placeholder:"TIME" env:"RELAYCTL_SINCE"`
	JSON  bool   `name:"json" help:"Print the hub's answer, {\"in_doubt\":[...]} with each call in the in-doubt journal's form, as it is." env:"RELAYCTL_JSON"`

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

// Run lists the hub's recent calls in doubt (the last 1000 it keeps in
// memory), oldest first. Exit status 1 when the hub refuses or its answer
// is not such a list, 2 when it cannot be asked.
func (c *inDoubtCmd) Run(ctx context.Context, s *streams) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	since, err := c.since()
	if err != nil {
		return err
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
