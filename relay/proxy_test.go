package relay

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

func TestParseProxyProtocol(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want ProxyProtocol
	}{{"off", ProxyOff}, {"optional", ProxyOptional}, {" Required ", ProxyRequired}} {
		got, err := ParseProxyProtocol(tt.in)
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got)
		assert.Equal(t, strings.ToLower(strings.TrimSpace(tt.in)), got.String())
	}
	_, err := ParseProxyProtocol("v2")
	assert.EqualError(t, err, `PROXY protocol "v2": want off, optional or required`)
}

func TestParseTrusted(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"10.0.0.5", "10.0.0.5/32"},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.1.2.3/24", "10.1.2.0/24"},
		{"::1", "::1/128"},
		{"fd00::/8", "fd00::/8"},
		{"::ffff:192.0.2.1", "192.0.2.1/32"},
		{"::ffff:192.0.2.0/120", "192.0.2.0/24"},
	}
	for _, tt := range tests {
		got, err := ParseTrusted(tt.in)
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got.String(), tt.in)
	}
	for _, bad := range []string{"", "lb.example", "10.0.0.0/33", "fe80::1%eth0"} {
		_, err := ParseTrusted(bad)
		assert.Error(t, err, bad)
	}
}

func TestNewChecksTheProxySettings(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.ProxyProtocol = ProxyRequired
	_, err := New(cfg)
	assert.EqualError(t, err, "relay: ProxyProtocol required needs ProxyTrusted: the addresses whose PROXY headers are believed")
	cfg.ProxyProtocol = 7
	_, err = New(cfg)
	assert.EqualError(t, err, "relay: unknown ProxyProtocol(7)")
}

// proxyHeader returns a PROXY header of the given version (1 or 2) for a
// TCP connection from src to dst.
func proxyHeader(t *testing.T, version byte, src, dst string) []byte {
	t.Helper()
	h := proxyproto.HeaderProxyFromAddrs(version,
		net.TCPAddrFromAddrPort(netip.MustParseAddrPort(src)), net.TCPAddrFromAddrPort(netip.MustParseAddrPort(dst)))
	b, err := h.Format()
	require.NoError(t, err)
	return b
}

// localHeader returns a PROXY v2 LOCAL header: a balancer's own
// connection, a health check, with no client address.
func localHeader(t *testing.T) []byte {
	t.Helper()
	b, err := (&proxyproto.Header{Version: 2, Command: proxyproto.LOCAL, TransportProtocol: proxyproto.UNSPEC}).Format()
	require.NoError(t, err)
	return b
}

// proxyServer serves CORE (echoing) with the given PROXY settings, an
// access log and a captured log.
func proxyServer(t *testing.T, mode ProxyProtocol, trusted ...string) (srv *Server, addr string, access, logs *logtest.Buffer) {
	t.Helper()
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	access, logs = &logtest.Buffer{}, &logtest.Buffer{}
	cfg.AccessLog = access
	cfg.Logger = zerolog.New(logs).Level(zerolog.DebugLevel)
	cfg.ProxyProtocol = mode
	for _, s := range trusted {
		p, err := ParseTrusted(s)
		require.NoError(t, err)
		cfg.ProxyTrusted = append(cfg.ProxyTrusted, p)
	}
	srv, addr = startServer(t, cfg)
	return srv, addr, access, logs
}

// accessLines shuts srv down, so its access log is written out, and
// returns the log's lines.
func accessLines(t *testing.T, srv *Server, access *logtest.Buffer) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hubtest.IOTimeout)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	return access.Lines(t)
}

func TestProxyHeaderGivesTheClientAddress(t *testing.T) {
	tests := []struct {
		name   string
		header func(t *testing.T, dst string) []byte
		split  bool // the header and the first line in separate writes
	}{
		{"v2, the first line in the same write", func(t *testing.T, dst string) []byte { return proxyHeader(t, 2, "203.0.113.7:51234", dst) }, false},
		{"v2, the first line later", func(t *testing.T, dst string) []byte { return proxyHeader(t, 2, "203.0.113.7:51234", dst) }, true},
		{"v1", func(t *testing.T, dst string) []byte { return proxyHeader(t, 1, "203.0.113.7:51234", dst) }, false},
		{"v2 over IPv6", func(t *testing.T, _ string) []byte {
			return proxyHeader(t, 2, "[2001:db8::7]:51234", "[2001:db8::1]:9200")
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Given a hub that requires PROXY headers from 127.0.0.1
			srv, addr, access, logs := proxyServer(t, ProxyRequired, "127.0.0.1")
			c := hubtest.DialFrom(t, "127.0.0.1", addr)

			// When the balancer sends a header, then lines
			hdr := tt.header(t, addr)
			if tt.split {
				_, err := c.Conn().Write(hdr)
				require.NoError(t, err)
				time.Sleep(10 * time.Millisecond)
				hdr = nil
			}
			_, err := c.Conn().Write(append(hdr, "T1|CORE|a\n"...))
			require.NoError(t, err)

			// Then the lines are served as ever,
			assert.Equal(t, "T1|0000|got a", c.ReadResponse().String())
			assert.Equal(t, "T2|E903|"+protocol.MsgUnknownTarget, c.Exchange("T2|NONE|b").String())
			c.Conn().Close()

			// and the access log and the connection's log name the client
			// the header gave, and the balancer.
			want := "203.0.113.7:51234"
			if strings.Contains(tt.name, "IPv6") {
				want = "[2001:db8::7]:51234"
			}
			lines := accessLines(t, srv, access)
			require.Len(t, lines, 2)
			for _, l := range lines {
				assert.Equal(t, want, l["client"])
			}
			closed := logs.Messages(t, "connection closed")
			require.Len(t, closed, 1)
			assert.Equal(t, want, closed[0]["remote"])
			assert.Equal(t, c.Conn().LocalAddr().String(), closed[0]["proxy"])
		})
	}
}

func TestProxyRules(t *testing.T) {
	v2 := func(t *testing.T, addr string) []byte { return proxyHeader(t, 2, "203.0.113.7:51234", addr) }
	none := func(*testing.T, string) []byte { return nil }
	tests := []struct {
		name   string
		mode   ProxyProtocol
		from   string // the peer's loopback address; 127.0.0.1 is trusted
		header func(t *testing.T, addr string) []byte
		client string // the access log's client; empty: refused
		reason string // the refusal's reason
	}{
		{"required, untrusted: refused at once", ProxyRequired, "127.0.0.2", v2, "", "not from a trusted PROXY sender"},
		{"required, trusted, no header: refused", ProxyRequired, "127.0.0.1", none, "", "no PROXY header"},
		{"required, trusted, a bad header: refused", ProxyRequired, "127.0.0.1", func(*testing.T, string) []byte { return []byte("PROXY TCP4 nonsense\r\n") }, "", "bad PROXY header"},
		{"required, trusted, LOCAL: the balancer's own address", ProxyRequired, "127.0.0.1", func(t *testing.T, _ string) []byte { return localHeader(t) }, "127.0.0.1:", ""},
		{"optional, untrusted with a header: refused", ProxyOptional, "127.0.0.2", v2, "", "PROXY header from an address not trusted to send one"},
		{"optional, untrusted without a header: served as it is", ProxyOptional, "127.0.0.2", none, "127.0.0.2:", ""},
		{"optional, trusted without a header: served as it is", ProxyOptional, "127.0.0.1", none, "127.0.0.1:", ""},
		{"optional, trusted with a header: the header's client", ProxyOptional, "127.0.0.1", v2, "203.0.113.7:51234", ""},
		{"off: a header is a malformed line", ProxyOff, "127.0.0.1", func(t *testing.T, addr string) []byte { return proxyHeader(t, 1, "203.0.113.7:51234", addr) }, "127.0.0.1:", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var trusted []string
			if tt.mode != ProxyOff {
				trusted = []string{"127.0.0.1/32"}
			}
			srv, addr, access, logs := proxyServer(t, tt.mode, trusted...)
			c := hubtest.DialFrom(t, tt.from, addr)
			_, err := c.Conn().Write(append(tt.header(t, addr), "T1|CORE|a\n"...))
			require.NoError(t, err)
			if tt.client == "" {
				c.ExpectEOF()
				refused := logs.Messages(t, "connection refused")
				require.Len(t, refused, 1)
				assert.Contains(t, refused[0]["reason"], tt.reason)
				assert.Equal(t, tt.mode.String(), refused[0]["proxy_protocol"])
				assert.Contains(t, refused[0]["remote"], tt.from+":")
				assert.Empty(t, accessLines(t, srv, access))
				return
			}
			if tt.mode == ProxyOff {
				assert.True(t, strings.HasPrefix(c.ReadResponse().String(), "-|E900|"))
			}
			assert.Equal(t, "T1|0000|got a", c.ReadResponse().String())
			c.Conn().Close()
			lines := accessLines(t, srv, access)
			require.NotEmpty(t, lines)
			for _, l := range lines {
				assert.Contains(t, l["client"], tt.client)
			}
			assert.Empty(t, logs.Messages(t, "connection refused"))
		})
	}
}

func TestProxyOptionalNeverHoldsAShortFirstLine(t *testing.T) {
	// Given a hub that takes optional PROXY headers from the client's own
	// address
	_, addr, _, _ := proxyServer(t, ProxyOptional, "127.0.0.1")
	c := hubtest.DialFrom(t, "127.0.0.1", addr)

	// When a client's first line starts like a signature but is shorter
	// than one, it is answered at once: the hub waits for no more bytes
	// than the client sent.
	start := time.Now()
	assert.Equal(t, "P|E903|"+protocol.MsgUnknownTarget, c.Exchange("P|X|").String())
	assert.Less(t, time.Since(start), proxyHeaderTimeout/2)
}

func TestProxyRequiredGivesUpOnASilentConnection(t *testing.T) {
	// Given a hub that requires PROXY headers, with a short idle timeout
	// that bounds the wait for the header
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.IdleTimeout = 100 * time.Millisecond
	cfg.ProxyProtocol, cfg.ProxyTrusted = ProxyRequired, []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	_, addr := startServer(t, cfg)

	// When a trusted peer connects and says nothing, the hub closes it.
	c := hubtest.DialFrom(t, "127.0.0.1", addr)
	start := time.Now()
	c.ExpectEOF()
	assert.Less(t, time.Since(start), proxyHeaderTimeout)
}

// TestProxiedConnectionDoesNotAllocate checks that a connection that
// opened with a PROXY header is read like any other after its header: an
// E904 line costing no allocation.
func TestProxiedConnectionDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.ProxyProtocol, cfg.ProxyTrusted = ProxyRequired, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	srv := openCoreServer(t, cfg)
	nc, client := tcpPair(t)
	_, err := client.Write(proxyHeader(t, 2, "198.51.100.9:40000", nc.LocalAddr().String()))
	require.NoError(t, err)
	c := newConn(srv, nc)
	require.True(t, c.acceptProxyHeader())
	assert.Equal(t, "198.51.100.9:40000", c.adm.client.String())
	assert.Zero(t, e904AllocsPerLine(t, c, client))
}

// BenchmarkFastFailLoopbackDepth1Proxied is BenchmarkFastFailLoopbackDepth1
// with every connection opening with a PROXY v2 header, as behind HAProxy
// with send-proxy-v2: after the header, a proxied connection must cost
// what any other does.
func BenchmarkFastFailLoopbackDepth1Proxied(b *testing.B) {
	srv := benchServer(b, Config{
		TargetSettings: TargetSettings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Hour}},
		ProxyProtocol:  ProxyRequired,
		ProxyTrusted:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	}, false, false)
	rt := srv.table.lookup([]byte("CORE"))
	ticket, _, err := rt.breaker.Allow()
	require.NoError(b, err)
	rt.breaker.Done(ticket, true, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = srv.Serve(ln) }()
	hdr, err := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 4711}, ln.Addr()).Format()
	require.NoError(b, err)
	depth1Clients(b, ln.Addr().String(), hdr)
}

// BenchmarkReadProxyHeader measures what reading a PROXY v2 header costs a
// connection, once, before its first line.
func BenchmarkReadProxyHeader(b *testing.B) {
	hdr, err := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 4711},
		&net.TCPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 9200}).Format()
	require.NoError(b, err)
	in := append(hdr, "TX-1|CORE|BAL 1001\n"...)
	var src bytes.Reader
	br := bufio.NewReaderSize(nil, proxyReadBufSize)
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(in)
		br.Reset(&src)
		if h, err := readProxyHeader(br); err != nil || h == nil {
			b.Fatal(err)
		}
	}
}
