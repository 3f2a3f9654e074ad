package relay

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"
)

// ProxyProtocol says whether client connections open with a PROXY protocol
// header, v1 or v2, as a load balancer in TCP mode writes it (HAProxy's
// send-proxy and send-proxy-v2), and so whose address the hub takes for
// the client's: the header's source rather than the balancer's. Headers
// are believed only from Config.ProxyTrusted. It is a plain value.
type ProxyProtocol uint8

const (
	// ProxyOff reads no header: a connection's first bytes are its first
	// line, and a PROXY header a client sends is a malformed line.
	ProxyOff ProxyProtocol = iota
	// ProxyOptional lets a connection from a trusted address open with a
	// header, used when present; a connection from any other address is
	// served as it is, and refused if it opens with a header.
	ProxyOptional
	// ProxyRequired makes a connection from a trusted address open with a
	// header, or be refused; a connection from any other address is refused
	// at once.
	ProxyRequired
	numProxyProtocols
)

var proxyProtocolNames = [numProxyProtocols]string{"off", "optional", "required"}

// String returns "off", "optional" or "required".
func (p ProxyProtocol) String() string {
	if p < numProxyProtocols {
		return proxyProtocolNames[p]
	}
	return fmt.Sprintf("ProxyProtocol(%d)", p)
}

// ParseProxyProtocol returns the ProxyProtocol named by s: off, optional or
// required.
func ParseProxyProtocol(s string) (ProxyProtocol, error) {
	if i := slices.Index(proxyProtocolNames[:], strings.ToLower(strings.TrimSpace(s))); i >= 0 {
		return ProxyProtocol(i), nil
	}
	return 0, fmt.Errorf("PROXY protocol %q: want off, optional or required", s)
}

// ParseTrusted reads one trusted source of PROXY headers: an address
// ("10.0.0.5", "::1") or a CIDR range ("10.0.0.0/24"), IPv4-mapped IPv6
// forms taken as IPv4.
func ParseTrusted(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q: want an IP address or a CIDR range", s)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q: want an IP address or a CIDR range", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// proxyHeaderTimeout bounds the wait for a connection's PROXY header (or,
// with ProxyOptional, for the first bytes that tell there is none): a
// load balancer sends the header as it connects. The idle timeout bounds
// it too, when shorter.
const proxyHeaderTimeout = 5 * time.Second

// proxyReadBufSize is the buffer a PROXY header is read through. It holds
// a whole v1 header (at most 107 bytes), which the parser needs in one
// read; v2 headers may be longer and are read on. What it holds past the
// header becomes the connection's first input, so it is smaller than a
// read buffer.
const proxyReadBufSize = 256

// proxyReaders lends the buffered readers headers are read through.
var proxyReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, proxyReadBufSize) }}

// Outcomes of readProxyHeader besides a header and a read error.
var (
	// errNoProxyHeader reports that a connection's first bytes are not a
	// PROXY signature.
	errNoProxyHeader = errors.New("no PROXY header")
	// errBadProxyHeader reports a PROXY signature followed by no valid
	// header.
	errBadProxyHeader = errors.New("bad PROXY header")
)

// proxyLogBurst is how many refused connections a second are logged at
// warn, so that a misconfigured balancer or a scan cannot flood the log.
const proxyLogBurst = 5

// setProxyProtocol checks and sets the Server's PROXY protocol settings.
func (s *Server) setProxyProtocol(p ProxyProtocol, trusted []netip.Prefix) error {
	switch {
	case p >= numProxyProtocols:
		return fmt.Errorf("relay: unknown %s", p)
	case p != ProxyOff && len(trusted) == 0:
		return fmt.Errorf("relay: ProxyProtocol %s needs ProxyTrusted: the addresses whose PROXY headers are believed", p)
	}
	for _, t := range trusted {
		if !t.IsValid() {
			return fmt.Errorf("relay: ProxyTrusted: invalid prefix %v", t)
		}
	}
	s.proxyProtocol, s.proxyTrusted = p, slices.Clone(trusted)
	s.obs.proxyLog = s.obs.log.Sample(&zerolog.BurstSampler{Burst: proxyLogBurst, Period: time.Second})
	return nil
}

// trusts reports whether a PROXY header from addr is believed.
func (s *Server) trusts(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range s.proxyTrusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// addrPortOf returns a's address and port, IPv4-mapped addresses as IPv4;
// the zero AddrPort when a is no TCP address.
func addrPortOf(a net.Addr) netip.AddrPort {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}
	}
	ap := ta.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// acceptProxyHeader readies the connection for its read loop: it sets the client's
// address, from the PROXY header when the Server takes one from this
// peer, and leaves in the read buffer whatever the client sent after the
// header. It reports false, the connection still open, when it must be
// closed unserved: refused by the PROXY rules (and logged), or gone before
// it said anything.
//
// The header is read through a small pooled buffer. Over TLS it is read
// from the socket beneath, in the clear, and what follows it is the TLS
// handshake's (proxiedSocket).
func (c *conn) acceptProxyHeader() bool {
	s := c.srv
	peer := addrPortOf(c.nc.RemoteAddr())
	c.adm.client = peer
	if s.proxyProtocol == ProxyOff {
		return true
	}
	trusted := s.trusts(peer.Addr())
	if !trusted && s.proxyProtocol == ProxyRequired {
		s.refuseProxy(peer, "not from a trusted PROXY sender")
		return false
	}
	c.stopMu.Lock()
	if c.stopped {
		c.stopMu.Unlock()
		return false
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(min(proxyHeaderTimeout, s.idleTimeout)))
	c.stopMu.Unlock()

	br := proxyReaders.Get().(*bufio.Reader)
	ps := proxiedSocketOf(c.nc)
	if ps != nil {
		br.Reset(ps.Conn)
	} else {
		br.Reset(c.nc)
	}
	defer func() {
		br.Reset(nil)
		proxyReaders.Put(br)
	}()
	hdr, err := readProxyHeader(br)
	input := br.Buffered() > 0
	// The client's first input, after the header or all of it when there
	// is none, is the TLS handshake's or the read loop's.
	switch {
	case input && ps != nil:
		ps.keep(br)
	case input:
		b, _ := br.Peek(br.Buffered())
		c.in.preload(b)
	}
	switch {
	case hdr != nil && trusted:
		if src, ok := hdr.SourceAddr.(*net.TCPAddr); ok && !hdr.Command.IsLocal() {
			ap := src.AddrPort()
			c.adm.client, c.adm.peer = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), &connPeer{proxy: peer}
		}
		return true
	case hdr != nil:
		s.refuseProxy(peer, "PROXY header from an address not trusted to send one")
		return false
	case errors.Is(err, errBadProxyHeader):
		s.refuseProxy(peer, err.Error())
		return false
	case c.stoppedReading():
		return false
	case errors.Is(err, errNoProxyHeader) || isTimeout(err) || err == io.EOF && input:
		if s.proxyProtocol == ProxyRequired {
			s.refuseProxy(peer, "no PROXY header")
			return false
		}
		return true
	default:
		// Gone before a byte came (a balancer's TCP check does this), or
		// the connection failed: nothing to refuse.
		return false
	}
}

// readProxyHeader reads a PROXY header, v1 or v2, from the start of br. As
// soon as the bytes read are no prefix of either signature it returns
// errNoProxyHeader, having consumed nothing, so a client's first line never
// waits for more input than the client sends. A read error before a whole
// signature has come is returned as it is, with what came still buffered;
// a signature without a valid header after it is errBadProxyHeader.
func readProxyHeader(br *bufio.Reader) (*proxyproto.Header, error) {
	for n := 1; ; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return nil, err
		}
		v1 := n <= len(proxyproto.SIGV1) && bytes.Equal(b, proxyproto.SIGV1[:n])
		v2 := n <= len(proxyproto.SIGV2) && bytes.Equal(b, proxyproto.SIGV2[:n])
		switch {
		case !v1 && !v2:
			return nil, errNoProxyHeader
		case v1 && n == len(proxyproto.SIGV1), v2 && n == len(proxyproto.SIGV2):
			h, err := proxyproto.Read(br)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errBadProxyHeader, err)
			}
			return h, nil
		}
	}
}

// isTimeout reports whether err is a passed read deadline: no header came
// in time.
func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// refuseProxy logs a connection refused by the PROXY rules, from peer, for
// why.
func (s *Server) refuseProxy(peer netip.AddrPort, why string) {
	s.obs.proxyLog.Warn().Stringer("remote", peer).Str("proxy_protocol", s.proxyProtocol.String()).
		Str("reason", why).Msg("connection refused")
}
