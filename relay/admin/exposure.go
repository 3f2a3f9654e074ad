package admin

import (
	"net"
	"net/http"
)

// needsToken reports whether r must carry the bearer token. Without a
// token, none does. With one, every request does except the reads (GET,
// HEAD) of a client on loopback, and the probes /healthz and /readyz from
// anywhere, which tell only that the hub runs and accepts: a load
// balancer's health check needs no secret, while the status and the
// metrics, which describe the bank's back ends, are for those who hold it
// once the port is reachable from other machines.
func (a *Handler) needsToken(r *http.Request) bool {
	switch {
	case !a.hasToken:
		return false
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		return true
	case r.URL.Path == "/healthz" || r.URL.Path == "/readyz":
		return false
	}
	return !fromLoopback(r.RemoteAddr)
}

// fromLoopback reports whether a request's remote address, IP:port, is a
// loopback address.
func fromLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
