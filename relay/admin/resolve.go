package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/resolver"
)

// OpenEntry is a transaction in doubt still open, as GET /in-doubt?open=1
// lists it. A plain value.
type OpenEntry struct {
	Target string    `json:"target"`
	TxID   string    `json:"txid"`
	Since  time.Time `json:"since"` // when the call went in doubt
	// AgeSeconds is how long ago that was.
	AgeSeconds float64 `json:"age_seconds"`
	Policy     string  `json:"policy"` // lookup, reverse or manual
	Attempts   int     `json:"attempts"`
	// NextAttempt is when the next attempt is due; absent for a manual
	// entry.
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
	InFlight    bool       `json:"in_flight"`
}

// serveOpenInDoubt is GET /in-doubt?open=1: {"open":[...]}, each target's
// oldest first.
func serveOpenInDoubt(hub InDoubtHub, w http.ResponseWriter) {
	open := hub.OpenInDoubt()
	out := make([]OpenEntry, len(open))
	for i, e := range open {
		out[i] = OpenEntry{Target: e.Target, TxID: e.TxID, Since: e.Since.UTC(), AgeSeconds: ageSeconds(e.Since),
			Policy: string(e.Policy), Attempts: e.Attempts, NextAttempt: timeOrNil(e.Next), InFlight: e.InFlight}
	}
	writeJSON(w, http.StatusOK, struct {
		Open []OpenEntry `json:"open"`
	}{out})
}

// settleRequest is the body of POST /in-doubt/{txid}/resolve.
type settleRequest struct {
	Target     string `json:"target"`
	Applied    bool   `json:"applied"`
	NotApplied bool   `json:"not_applied"`
	Code       string `json:"code"`
}

// settleAnswer is the answer of POST /in-doubt/{txid}/resolve.
type settleAnswer struct {
	Target  string `json:"target"`
	TxID    string `json:"txid"`
	Outcome string `json:"outcome"` // applied or not_applied
	Code    string `json:"code,omitempty"`
}

// serveSettle is POST /in-doubt/{txid}/resolve: an operator settles an
// open transaction in doubt, journalled via operator. 200 with what was
// settled; 400 for a bad body or code, 404 when no such transaction is
// open.
func (a *Handler) serveSettle(hub InDoubtHub, w http.ResponseWriter, r *http.Request) {
	txid := r.PathValue("txid")
	req, err := decodeSettle(http.MaxBytesReader(w, r.Body, maxActionBody))
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	a.operator(a.log.Info().Str("target", req.Target).Str("txid", txid).Bool("applied", req.Applied).Str("code", req.Code), r).Msg("in-doubt settlement")
	switch err := hub.SettleInDoubt(req.Target, txid, req.Applied, req.Code); {
	case errors.Is(err, relay.ErrNotInDoubt):
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("no open transaction in doubt %q at target %q", txid, req.Target))
		return
	case err != nil:
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	ans := settleAnswer{Target: req.Target, TxID: txid, Outcome: string(resolver.NotApplied)}
	if req.Applied {
		ans.Outcome, ans.Code = string(resolver.Applied), req.Code
	}
	if t, ok := hub.Target(req.Target); ok {
		ans.Target = t.Name
	}
	writeJSON(w, http.StatusOK, ans)
}

// settleUsage is what the body of POST /in-doubt/{txid}/resolve must be.
const settleUsage = `want {"target":"NAME","applied":true,"code":"0000"} or {"target":"NAME","not_applied":true}`

// decodeSettle reads the body of POST /in-doubt/{txid}/resolve: one JSON
// object naming the target and either applied with a code or not_applied.
func decodeSettle(body io.Reader) (settleRequest, error) {
	var req settleRequest
	if err := decodeBody(body, &req, settleUsage); err != nil {
		return req, err
	}
	switch {
	case req.Target == "":
		return req, fmt.Errorf("body: no target: %s", settleUsage)
	case req.Applied == req.NotApplied:
		return req, fmt.Errorf("body: one of applied and not_applied: %s", settleUsage)
	case req.Applied && req.Code == "":
		return req, fmt.Errorf("body: applied needs the target's code: %s", settleUsage)
	case req.NotApplied && req.Code != "":
		return req, fmt.Errorf("body: not_applied takes no code: %s", settleUsage)
	}
	return req, nil
}
