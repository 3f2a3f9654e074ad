package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/relayhub/relayhub/internal/cmdline"
)

// reloadCmd is `relayctl reload`: its flags, filled by kong. Not for
// concurrent use.
type reloadCmd struct {
	JSON bool `name:"json" help:"Print the hub's answer, {\"added\":[...],\"removed\":[...],\"changed\":[...]}, as it is." env:"RELAYCTL_JSON"`

	AdminFlags `embed:""`
}

// reloadAnswer is the JSON of a successful POST /reload. A plain value.
type reloadAnswer struct {
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	Changed []string `json:"changed"`
}

// Validate checks what the tags cannot.
func (c *reloadCmd) Validate() error { return c.validate() }

// Run asks the hub to re-read its settings file and prints what the reload
// added, removed and changed. Exit status 1 when the hub refuses: the file
// has a mistake (the hub keeps its running settings), the hub runs without
// one, or the token is missing or wrong; 2 when it cannot be asked.
func (c *reloadCmd) Run(ctx context.Context, s *streams) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	ans, err := client.do(ctx, http.MethodPost, "/reload", nil)
	if err != nil {
		return err
	}
	switch ans.status {
	case http.StatusOK:
	case http.StatusUnprocessableEntity:
		return cmdline.Exit(1, fmt.Errorf("POST %s: %s: settings refused, the hub keeps its running settings: %s",
			ans.url, ans.statusText, answerReason(ans.body)))
	default:
		return client.refused(ans)
	}
	var res reloadAnswer
	if err := json.Unmarshal(ans.body, &res); err != nil {
		return fmt.Errorf("POST %s: not a reload's answer: %w", ans.url, err)
	}
	if c.JSON {
		return writeRaw(s.Out, ans.body)
	}
	return writeReload(s.Out, res)
}

// writeReload prints a reload's answer on one line.
func writeReload(w io.Writer, res reloadAnswer) error {
	list := func(names []string) string {
		if len(names) == 0 {
			return "none"
		}
		return strings.Join(names, ", ")
	}
	_, err := fmt.Fprintf(w, "settings reloaded: added %s; removed %s; changed %s\n",
		list(res.Added), list(res.Removed), list(res.Changed))
	return err
}
