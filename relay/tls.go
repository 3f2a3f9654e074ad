package relay

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay/clientcert"
)

// DefaultTLSHandshakeTimeout bounds a client's TLS handshake when
// TLSConfig.HandshakeTimeout is zero.
const DefaultTLSHandshakeTimeout = 5 * time.Second

// TLSConfig makes a Server speak TLS to its clients (docs/OPERATING.md,
// "TLS"). It is a plain value; New copies it.
//
// The handshake runs on the connection's own goroutine, never in the
// accept loop, and the connection counts against MaxConns from accept, so
// clients that stall their handshakes hold no more than MaxConns
// connections, each for HandshakeTimeout at most. A handshake that fails
// closes the connection and is counted in relay_tls_handshake_failures_total
// with its reason.
type TLSConfig struct {
	// Certificate returns the hub's certificate for a handshake. It is
	// called for every full handshake, so the certificate may change while
	// the Server runs: new handshakes get the new one, established
	// connections keep theirs. It must be safe for concurrent use.
	// Required.
	Certificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ClientCAs, when set, requires mutual TLS: every client must present
	// a certificate for client authentication that chains to the pool
	// ClientCAs returns. The pool is asked for at every handshake, resumed
	// ones included, so a CA taken out of it is refused from the next
	// handshake on, even to a client resuming an earlier session. It must
	// be safe for concurrent use. Nil means clients present no certificate.
	ClientCAs func() *x509.CertPool
	// MinVersion is the oldest TLS version accepted: tls.VersionTLS12 or
	// tls.VersionTLS13. Zero means TLS 1.2.
	MinVersion uint16
	// HandshakeTimeout bounds a client's handshake, from the moment its
	// connection is served. Zero means DefaultTLSHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// tlsServer is the TLS side of a Server: the configuration every
// handshake starts from, and how failures are counted and logged. It is
// safe for concurrent use; its fields are set once by newTLSServer.
type tlsServer struct {
	config    *tls.Config
	timeout   time.Duration
	clientCAs func() *x509.CertPool // nil: no client certificates
	failLog   zerolog.Logger        // sampled to tlsLogBurst lines a second
	metrics   *Metrics              // nil without metrics
	verified  clientcert.Chains
}

// tlsLogBurst is how many refused handshakes and refused requests (E908)
// a second are logged at warn; the metrics count every one.
const tlsLogBurst = 5

// newTLSServer checks cfg and returns the TLS side of a Server.
func newTLSServer(cfg TLSConfig, log zerolog.Logger, m *Metrics) (*tlsServer, error) {
	switch {
	case cfg.Certificate == nil:
		return nil, errors.New("relay: TLS needs a Certificate")
	case cfg.HandshakeTimeout < 0:
		return nil, errors.New("relay: TLS HandshakeTimeout must not be negative")
	}
	minVersion := cfg.MinVersion
	switch minVersion {
	case 0:
		minVersion = tls.VersionTLS12
	case tls.VersionTLS12, tls.VersionTLS13:
	default:
		return nil, fmt.Errorf("relay: TLS MinVersion %#04x: want TLS 1.2 or 1.3", cfg.MinVersion)
	}
	t := &tlsServer{
		timeout:   orDefault(cfg.HandshakeTimeout, DefaultTLSHandshakeTimeout),
		clientCAs: cfg.ClientCAs,
		failLog:   log.Sample(&zerolog.BurstSampler{Burst: tlsLogBurst, Period: time.Second}),
		metrics:   m,
	}
	t.config = &tls.Config{
		MinVersion:     minVersion,
		GetCertificate: cfg.Certificate,
	}
	if cfg.ClientCAs != nil {
		// The hub verifies the client's chain itself, in VerifyConnection,
		// rather than leaving it to crypto/tls: so the pool can change
		// while the Server runs, a session resumed after a CA was removed
		// is refused, and every refusal has a reason the metrics can tell
		// apart. crypto/tls still checks that the client holds the key of
		// the certificate it presents.
		t.config.ClientAuth = tls.RequestClientCert
		t.config.VerifyConnection = t.verifyClient
	}
	return t, nil
}

// tlsFailure is why a TLS handshake with a client failed: an index into
// the fixed reason label values of relay_tls_handshake_failures_total.
type tlsFailure uint8

const (
	tlsTimeout       tlsFailure = iota // no complete handshake within the handshake timeout
	tlsClosed                          // the client hung up mid-handshake
	tlsNotTLS                          // the first bytes were no TLS record: plain text on the TLS port
	tlsNoClientCert                    // mutual TLS, and the client presented no certificate
	tlsExpired                         // the client's certificate has expired
	tlsUnknownCA                       // the client's certificate chains to no CA of the hub's
	tlsBadCert                         // another refused client certificate: not yet valid, not for client authentication, ...
	tlsClientRefused                   // the client ended the handshake with an alert, as a client that does not trust the hub's certificate does
	tlsProtocol                        // anything else: no common version or cipher suite, a malformed message
	numTLSFailures
)

// tlsFailureNames are the reason label values, by tlsFailure.
var tlsFailureNames = [numTLSFailures]string{
	tlsTimeout:       "timeout",
	tlsClosed:        "closed",
	tlsNotTLS:        "not_tls",
	tlsNoClientCert:  "no_client_cert",
	tlsExpired:       "expired",
	tlsUnknownCA:     "unknown_ca",
	tlsBadCert:       "bad_cert",
	tlsClientRefused: "client_refused",
	tlsProtocol:      "protocol",
}

// classifyHandshake returns the reason a handshake failed with err.
func classifyHandshake(err error) tlsFailure {
	var (
		invalid   x509.CertificateInvalidError
		unknownCA x509.UnknownAuthorityError
		header    tls.RecordHeaderError
		timeout   interface{ Timeout() bool }
		op        *net.OpError
	)
	switch {
	case errors.Is(err, errNoClientCert):
		return tlsNoClientCert
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return tlsExpired
	case errors.As(err, &unknownCA):
		return tlsUnknownCA
	case errors.Is(err, errClientCertRefused):
		return tlsBadCert
	case errors.As(err, &header):
		return tlsNotTLS
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &timeout) && timeout.Timeout():
		return tlsTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return tlsClosed
	case errors.As(err, &op) && op.Op == "remote error":
		// crypto/tls reports an alert from the peer this way.
		return tlsClientRefused
	default:
		return tlsProtocol
	}
}

// handshake runs the TLS handshake of a connection served over TLS,
// bounded by the handshake timeout, and keeps the identities of the
// client's certificate, which allowed clients are matched against. It
// reports false, having counted and logged the failure, when
// the connection cannot be served; a connection that is not TLS needs no
// handshake. A handshake cut short by Shutdown is no failure.
func (c *conn) handshake() bool {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return true
	}
	t := c.srv.tls
	c.stopMu.Lock()
	if c.stopped {
		c.stopMu.Unlock()
		return false
	}
	// The read loop sets its own deadlines: the idle one before its first
	// read, the write one before its first write.
	_ = c.nc.SetDeadline(time.Now().Add(t.timeout))
	c.stopMu.Unlock()
	if err := tc.Handshake(); err != nil {
		c.stopMu.Lock()
		stopped := c.stopped
		c.stopMu.Unlock()
		if !stopped {
			t.logHandshakeFailure(err, c.logAddrs)
		}
		return false
	}
	cs := tc.ConnectionState()
	t.metrics.countHandshake(cs.DidResume)
	if len(cs.PeerCertificates) > 0 {
		p := c.adm.peer
		if p == nil {
			p = new(connPeer)
			c.adm.peer = p
		}
		p.identities = clientcert.Identities(cs.PeerCertificates[0])
		p.scope = certScope(cs.PeerCertificates[0], p.identities)
	}
	c.logAddrs(c.srv.obs.log.Debug()).Strs("client", c.adm.certIdentities()).
		Bool("resumed", cs.DidResume).Str("tls_version", tls.VersionName(cs.Version)).Msg("tls handshake done")
	return true
}

// handshakeTurnedAway runs the TLS handshake of a connection turned away
// over MaxConns, so that it can be told why in a line it can read. The
// handshake and that line share turnAwayWriteTimeout. It reports false,
// having counted the failure, when the handshake fails; a connection that
// is not TLS needs none.
func (s *Server) handshakeTurnedAway(nc net.Conn) bool {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return true
	}
	_ = nc.SetDeadline(time.Now().Add(turnAwayWriteTimeout))
	if ps, ok := tc.NetConn().(*proxiedSocket); ok {
		// The handshake starts after the PROXY header, if any. Whose header
		// it is does not matter: the connection is turned away whatever
		// it says.
		br := proxyReaders.Get().(*bufio.Reader)
		br.Reset(ps.Conn)
		_, _ = readProxyHeader(br)
		ps.keep(br)
		br.Reset(nil)
		proxyReaders.Put(br)
	}
	if err := tc.Handshake(); err != nil {
		s.tls.logHandshakeFailure(err, func(ev *zerolog.Event) *zerolog.Event {
			return ev.Str("remote", nc.RemoteAddr().String())
		})
		return false
	}
	return true
}

// server returns the TLS side of a client connection accepted on nc, its
// handshake not yet begun. With proxied, for the PROXY protocol, the
// socket is wrapped in a proxiedSocket, so that the header can be read from
// the socket itself before the handshake.
func (t *tlsServer) server(nc net.Conn, proxied bool) *tls.Conn {
	if proxied {
		nc = &proxiedSocket{Conn: nc}
	}
	return tls.Server(nc, t.config)
}

// proxiedSocket is the socket beneath a TLS connection that may open with
// a PROXY header: the header is read from the socket, in the clear, before
// the TLS handshake, and the bytes read past it (the start of the
// handshake) are kept for the handshake's first reads. Its pending bytes
// are set and read by the connection's own goroutine only, the header's
// read done before the handshake starts.
type proxiedSocket struct {
	net.Conn
	pending []byte // read past the PROXY header, not yet given to the TLS layer
}

// keep takes what br holds past a PROXY header, or all of it when there
// was none, for the handshake to read first.
func (p *proxiedSocket) keep(br *bufio.Reader) {
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		p.pending = bytes.Clone(b)
	}
}

// Read implements net.Conn: the pending bytes first, then the socket's.
func (p *proxiedSocket) Read(b []byte) (int, error) {
	if len(p.pending) > 0 {
		n := copy(b, p.pending)
		p.pending = p.pending[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// logHandshakeFailure counts and logs a handshake that failed with err; addrs adds
// the client's address to the log line.
func (t *tlsServer) logHandshakeFailure(err error, addrs func(*zerolog.Event) *zerolog.Event) {
	reason := classifyHandshake(err)
	t.metrics.countHandshakeFailure(reason)
	addrs(t.failLog.Warn()).Err(err).Str("reason", tlsFailureNames[reason]).
		Msg("tls handshake failed; connection closed")
}

// tlsMetrics count the TLS handshakes of clients. Safe for concurrent use.
type tlsMetrics struct {
	failures   [numTLSFailures]prometheus.Counter
	handshakes [2]prometheus.Counter // by resumed: 0 full, 1 resumed
}

// Names of the TLS metrics (docs/OPERATING.md, "TLS").
const (
	metricTLSHandshakes        = "relay_tls_handshakes_total"
	metricTLSHandshakeFailures = "relay_tls_handshake_failures_total"
	labelResumed               = "resumed"
)

// registerTLSMetrics creates the TLS metrics and registers them with reg.
func registerTLSMetrics(reg prometheus.Registerer) (*tlsMetrics, error) {
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricTLSHandshakeFailures,
		Help: "TLS handshakes of clients that failed, each closing its connection, by reason: timeout, closed, not_tls, no_client_cert, expired, unknown_ca, bad_cert, client_refused, protocol.",
	}, []string{labelReason})
	handshakes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricTLSHandshakes,
		Help: "TLS handshakes of clients that succeeded: resumed=\"true\" for a resumed session, \"false\" for a full handshake.",
	}, []string{labelResumed})
	tm := &tlsMetrics{}
	for i, name := range tlsFailureNames {
		tm.failures[i] = failures.WithLabelValues(name)
	}
	tm.handshakes[0] = handshakes.WithLabelValues("false")
	tm.handshakes[1] = handshakes.WithLabelValues("true")
	for _, c := range []prometheus.Collector{failures, handshakes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("relay: register metrics: %w", err)
		}
	}
	return tm, nil
}

// countHandshake counts a successful handshake. It does nothing on a nil
// Metrics.
func (m *Metrics) countHandshake(resumed bool) {
	if m == nil {
		return
	}
	if resumed {
		m.tls.handshakes[1].Inc()
	} else {
		m.tls.handshakes[0].Inc()
	}
}

// countHandshakeFailure counts a failed handshake. It does nothing on a
// nil Metrics.
func (m *Metrics) countHandshakeFailure(reason tlsFailure) {
	if m != nil {
		m.tls.failures[reason].Inc()
	}
}

// checkTargetTLS refuses the TLS settings of target t, canonically named
// name, that cannot work.
func (s *Server) checkTargetTLS(name string, t Target) error {
	if t.TLS != nil && !strings.HasPrefix(strings.ToLower(t.URL), "https://") {
		return fmt.Errorf("relay: target %s: TLS settings need an https:// URL, got %q", name, t.URL)
	}
	if len(t.AllowedClients) == 0 {
		return nil
	}
	if s.tls == nil || s.tls.clientCAs == nil {
		return fmt.Errorf("relay: target %s: AllowedClients need TLS with ClientCAs: without a verified client certificate there is no identity to match", name)
	}
	for _, p := range t.AllowedClients {
		if p == "" {
			return fmt.Errorf("relay: target %s: AllowedClients: empty pattern", name)
		}
	}
	return nil
}

// sameTargetTLS reports whether a and b, two targets' TLS settings as
// Target.TLS takes them, verify the target and present the hub alike: the
// same server name, verification, oldest version, CAs and client
// certificates. Settings read again from files that did not change are the
// same; after a rotation of one of the files they are not, so that a
// reload makes a new HTTP client with the new files.
func sameTargetTLS(a, b *tls.Config) bool {
	switch {
	case a == b:
		return true
	case a == nil || b == nil:
		return false
	}
	return a.ServerName == b.ServerName && a.InsecureSkipVerify == b.InsecureSkipVerify &&
		a.MinVersion == b.MinVersion && a.RootCAs.Equal(b.RootCAs) &&
		slices.EqualFunc(a.Certificates, b.Certificates, func(x, y tls.Certificate) bool {
			return slices.EqualFunc(x.Certificate, y.Certificate, bytes.Equal)
		})
}

// proxiedSocketOf returns the proxiedSocket beneath nc, a TLS connection
// that may open with a PROXY header; nil for any other connection.
func proxiedSocketOf(nc net.Conn) *proxiedSocket {
	if tc, ok := nc.(*tls.Conn); ok {
		ps, _ := tc.NetConn().(*proxiedSocket)
		return ps
	}
	return nil
}
