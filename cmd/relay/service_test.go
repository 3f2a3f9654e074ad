package main

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
)

func TestServiceFlagsAreOffByDefault(t *testing.T) {
	c, err := parse(t, nil)
	require.NoError(t, err)
	assert.Zero(t, c.ShutdownDelay)
	assert.Equal(t, "off", c.ProxyProtocol)
	assert.Empty(t, c.ProxyTrusted)
	mode, trusted := c.proxyConfig()
	assert.Equal(t, relay.ProxyOff, mode)
	assert.Empty(t, trusted)
}

func TestServiceFlagsFromTheEnvironment(t *testing.T) {
	c, err := parse(t, []string{
		"RELAY_SHUTDOWN_DELAY=5",
		"RELAY_PROXY_PROTOCOL=required",
		"RELAY_PROXY_TRUSTED=10.0.0.0/8,192.0.2.1",
	})
	require.NoError(t, err)
	assert.Equal(t, duration(5*time.Second), c.ShutdownDelay)
	mode, trusted := c.proxyConfig()
	assert.Equal(t, relay.ProxyRequired, mode)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32")}, trusted)

	// Repeated flags add up, and win over the variable.
	c, err = parse(t, []string{"RELAY_PROXY_TRUSTED=10.0.0.0/8"}, "--proxy-protocol", "optional",
		"--proxy-trusted", "192.0.2.1", "--proxy-trusted", "2001:db8::/32")
	require.NoError(t, err)
	mode, trusted = c.proxyConfig()
	assert.Equal(t, relay.ProxyOptional, mode)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("2001:db8::/32")}, trusted)
}

func TestBadServiceValuesNameTheirFlag(t *testing.T) {
	tests := []badFlagCase{
		{name: "negative delay", args: []string{"--shutdown-delay=-1s"}, want: "--shutdown-delay: must not be negative, got -1s"},
		{name: "bad delay", args: []string{"--shutdown-delay", "a bit"}, want: "--shutdown-delay"},
		{name: "unknown mode", args: []string{"--proxy-protocol", "v2"}, want: "--proxy-protocol"},
		{name: "required without trusted", args: []string{"--proxy-protocol", "required"}, want: "--proxy-trusted: name the load balancers whose PROXY headers to believe (--proxy-protocol required)"},
		{name: "optional without trusted", args: []string{"--proxy-protocol", "optional"}, want: "--proxy-trusted: name the load balancers"},
		{name: "bad trusted", args: []string{"--proxy-protocol", "optional", "--proxy-trusted", "lb1"}, want: `--proxy-trusted: "lb1": want an IP address or a CIDR range`},
		{name: "bad trusted range", args: []string{"--proxy-trusted", "10.0.0.0/40"}, want: `--proxy-trusted: "10.0.0.0/40"`},
	}
	assertBadFlags(t, tests)
}

func TestFileLimitError(t *testing.T) {
	assert.Equal(t, "--max-conns 1000 needs about 2214 descriptors but the file limit (RLIMIT_NOFILE) is 256: raise the limit (ulimit -n, LimitNOFILE= under systemd) or lower --max-conns",
		fileLimitError(1000, 2214, 256).Error())
}

func TestReloaderWithoutASettingsFileHasNothingToReload(t *testing.T) {
	rl := &reloader{log: zerolog.Nop()}
	_, err := rl.reloadForAdmin()
	assert.ErrorIs(t, err, admin.ErrNothingToReload)
	assert.EqualError(t, err, "the relay runs without --config: admin: nothing to reload")
	rl.reloadOnHangup() // nothing to do, and no hub to do it on
}

func TestReloaderBeforeTheHubIsBuilt(t *testing.T) {
	rl := &reloader{path: "relay.toml", log: zerolog.Nop()}
	_, err := rl.reloadForAdmin()
	assert.ErrorIs(t, err, errStarting)
}
