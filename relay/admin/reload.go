package admin

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/rs/zerolog"
)

// ErrNothingToReload is what Config.Reload returns, wrapped or not, when
// the hub has no settings to re-read (it was started without a settings
// file); POST /reload answers it 409.
var ErrNothingToReload = errors.New("admin: nothing to reload")

// reloadAnswer is the body of a successful POST /reload: the targets the
// reload added, removed and changed, each list present and possibly
// empty.
type reloadAnswer struct {
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	Changed []string `json:"changed"`
}

// serveReload is POST /reload: Config.Reload, answered 200 with what
// changed; 409 when there is nothing to reload; 422, with the reason, when
// the new settings were refused and the running ones kept. The request is
// logged, with who made it and from where, before the reload runs, so the
// reload's own log lines follow it.
func (a *Handler) serveReload(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSONError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: POST /reload")
		return
	}
	a.operator(a.log.Info(), r).Msg("reload requested")
	res, err := a.reloadFn()
	switch {
	case errors.Is(err, ErrNothingToReload):
		writeJSONError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeJSONError(w, http.StatusUnprocessableEntity, err.Error())
	default:
		writeJSON(w, http.StatusOK, reloadAnswer{
			Added:   nonNil(res.Added),
			Removed: nonNil(res.Removed),
			Changed: nonNil(res.Changed),
		})
	}
}

// nonNil returns s, or an empty slice for nil, so that JSON shows [] rather
// than null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// operator adds to ev who made the admin request r and from where: auth,
// "token" when the bearer token was required (and so given, or the request
// would have been refused) or "none" when the admin port has no token;
// remote, the client's address (from a PROXY header when a trusted load
// balancer sent one); and proxy, that balancer's address, when there was
// one.
func (a *Handler) operator(ev *zerolog.Event, r *http.Request) *zerolog.Event {
	auth := "none"
	if a.hasToken {
		auth = "token"
	}
	ev = ev.Str("auth", auth).Str("remote", r.RemoteAddr)
	if peer, ok := r.Context().Value(peerKey{}).(string); ok && peer != r.RemoteAddr {
		ev = ev.Str("proxy", peer)
	}
	return ev
}

// peerKey is the context key under which ConnContext keeps a connection's
// socket peer.
type peerKey struct{}

// ConnContext is the admin server's http.Server.ConnContext. When the
// admin listener reads PROXY headers, so that a request's RemoteAddr is the
// client's address a load balancer gave, it keeps the connection's own
// peer (the balancer) for the log of operator actions. It recognises such
// connections by a Raw method returning the connection beneath, as
// go-proxyproto's have, and never reads from the connection.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if pc, ok := c.(interface{ Raw() net.Conn }); ok {
		return context.WithValue(ctx, peerKey{}, pc.Raw().RemoteAddr().String())
	}
	return ctx
}
