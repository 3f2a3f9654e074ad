package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/relayhub/relayhub/internal/loadgen"
)

// breakerCmd is `relayctl breaker ACTION TARGET`: its arguments and flags,
// filled by kong. Not for concurrent use.
type breakerCmd struct {
	Action string `arg:"" enum:"open,hold,close,disable,enable" help:"open, or hold: held open, every request refused E904 (or sent to the target's fallback) and no probe admitted, until close or enable. close: closed with a failure count of 0, ending a hold or a disable. disable: closed and pass-through, admitting every call and never opening, still counting. enable: back to normal from where it stands; a held breaker starts an open period of its reset timeout."`
	Target string `arg:"" help:"The target, as status names it (matched case-insensitively)."`
	JSON   bool   `name:"json" help:"Print the hub's answer, the target's entry of /status, as it is." env:"RELAYCTL_JSON"`

	AdminFlags `embed:""`
}

// breakerActions maps the command's actions to the admin port's
// (POST /breakers/{target}): hold is open, the API's name for holding a
// breaker open by hand.
var breakerActions = map[string]string{
	"open": "open", "hold": "open", "close": "close", "disable": "disable", "enable": "enable",
}

// Validate checks what the tags cannot.
func (c *breakerCmd) Validate() error {
	if c.Target != "" && !loadgen.ValidTarget(c.Target) { // kong reports a missing one
		return fmt.Errorf("target %q: want a name without '|', spaces or control characters", c.Target)
	}
	return c.validate()
}

// Run posts the action to the target's breaker and prints the target as
// the hub answers it, in status's table. Exit status 1 when the hub
// refuses (an unknown target, a missing or wrong token), 2 when it cannot
// be asked.
func (c *breakerCmd) Run(ctx context.Context, s *streams) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	body, err := json.Marshal(map[string]string{"action": breakerActions[c.Action]})
	if err != nil {
		return err
	}
	ans, err := client.do(ctx, http.MethodPost, "/breakers/"+url.PathEscape(c.Target), body)
	if err != nil {
		return err
	}
	if ans.status != http.StatusOK {
		return client.refused(ans)
	}
	var t targetStatus
	if err := json.Unmarshal(ans.body, &t); err != nil || t.Name == "" {
		return fmt.Errorf("POST %s: not a target's status: %s", ans.url, firstLine(ans.body))
	}
	if c.JSON {
		return writeRaw(s.Out, ans.body)
	}
	return writeTargets(s.Out, []targetStatus{t}, t.Fleet != nil)
}
