package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/internal/filelimit"
	"github.com/relayhub/relayhub/relay"
)

// What the relay needs to run as a service behind a load balancer: the
// shutdown delay that lets the balancer's health check take it out of
// rotation before it stops accepting, the PROXY protocol that carries the
// client's address through the balancer, and a check that the process may
// open as many files as its configuration needs.

// proxyTrusted returns --proxy-trusted as prefixes.
func (c *cli) proxyTrusted() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.ProxyTrusted {
		if strings.TrimSpace(s) == "" {
			continue
		}
		p, err := relay.ParseTrusted(s)
		if err != nil {
			return nil, fmt.Errorf("--proxy-trusted: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// proxyConfig returns the PROXY protocol settings of the flags, which
// Validate has checked.
func (c *cli) proxyConfig() (relay.ProxyProtocol, []netip.Prefix) {
	mode, _ := relay.ParseProxyProtocol(c.ProxyProtocol)
	trusted, _ := c.proxyTrusted()
	return mode, trusted
}

// adminProxyListener wraps the admin port's listener, when the client port
// reads PROXY headers, so that operator actions coming through the load
// balancer are logged with the client's address: a connection from a
// trusted address may open with a header (never must: health checks and
// scrapes come straight), one from any other address is refused if it
// opens with one.
func adminProxyListener(ln net.Listener, mode relay.ProxyProtocol, trusted []netip.Prefix) net.Listener {
	if mode == relay.ProxyOff {
		return ln
	}
	return &proxyproto.Listener{
		Listener:          ln,
		ReadHeaderTimeout: adminProxyHeaderTimeout,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			if ta, ok := o.Upstream.(*net.TCPAddr); ok {
				addr := ta.AddrPort().Addr().Unmap()
				for _, p := range trusted {
					if p.Contains(addr) {
						return proxyproto.USE, nil
					}
				}
			}
			return proxyproto.REJECT, nil
		},
	}
}

// adminProxyHeaderTimeout bounds the admin port's wait for the first bytes
// of a connection that may open with a PROXY header.
const adminProxyHeaderTimeout = 5 * time.Second

// delayShutdown is the start of a shutdown behind a load balancer: the hub
// is withdrawn (/readyz answers 503 from now on) and goes on serving for
// delay, or until a second SIGINT or SIGTERM, so that the balancer's health
// check takes it out of rotation before it stops accepting. A zero delay
// does nothing.
func delayShutdown(srv *relay.Server, delay time.Duration, logger zerolog.Logger) {
	if delay <= 0 {
		return
	}
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	srv.Withdraw()
	logger.Info().Stringer("shutdown_delay", delay).Msg("leaving service: /readyz answers 503, serving on until the shutdown delay has passed")
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case sig := <-again:
		logger.Info().Stringer("signal", sig).Msg("shutdown delay cut short")
	}
}

// checkFileLimit refuses a configuration that needs more open files than
// the process may have (filelimit.Needed).
func checkFileLimit(srv *relay.Server, maxConns int, stateStore string) error {
	limit, ok := filelimit.Raise()
	if !ok {
		return nil
	}
	var bulkheads []int
	for _, t := range srv.Targets() {
		bulkheads = append(bulkheads, t.MaxInFlight)
	}
	if need := filelimit.Needed(maxConns, bulkheads, filelimit.StoreConns(stateStore != "")); limit < need {
		return fileLimitError(maxConns, need, limit)
	}
	return nil
}

// fileLimitError is the one line that refuses a configuration whose files
// the limit cannot hold.
func fileLimitError(maxConns int, need, limit uint64) error {
	return fmt.Errorf("--max-conns %d needs about %d descriptors but the file limit (RLIMIT_NOFILE) is %d: "+
		"raise the limit (ulimit -n, LimitNOFILE= under systemd) or lower --max-conns", maxConns, need, limit)
}
