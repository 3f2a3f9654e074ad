package loadgen

import (
	"fmt"
	"strings"
	"time"
)

// Flags are the command-line flags of a load run against the hub, tagged
// for kong: a command embeds them with an envprefix, so every flag also has
// an environment variable (--conns is RELAYCTL_CONNS under the prefix
// RELAYCTL_), and defines the variable rate_depth as RateDepth for the help
// text. Config turns them into a Config with the hub's line protocol and no
// CPU meters; a benchmark command adds those from flags of its own. Flags
// are filled by kong and not for concurrent use.
type Flags struct {
	Addr           string            `help:"Hub client address, host:port." default:"127.0.0.1:9200" env:"ADDR"`
	Conns          int               `help:"Number of connections." default:"16" env:"CONNS"`
	Depth          int               `help:"Requests outstanding per connection: a closed loop keeps exactly this many in flight; with --rate it caps a connection whose answers fall behind. 0 means 1 in a closed loop and ${rate_depth} with --rate." default:"0" env:"DEPTH"`
	Duration       time.Duration     `help:"How long to send (ignored when --requests is given)." default:"10s" env:"DURATION"`
	Requests       uint64            `help:"Total number of requests to send; takes precedence over --duration. 0 means use --duration." default:"0" env:"REQUESTS"`
	Mix            string            `help:"Targets and their weights, e.g. CORE=70,CLAIM=30; a name without a weight weighs 1." default:"CORE=100" env:"MIX"`
	Payload        string            `help:"Payload template: {n} is the request number (1, 2, ...), {conn} the connection number." default:"BAL ACC{conn}" env:"PAYLOAD"`
	TargetPayload  map[string]string `name:"target-payload" help:"Payload template for one target, overriding --payload, as NAME=TEMPLATE (repeatable)." placeholder:"NAME=TEMPLATE" mapsep:"none" env:"TARGET_PAYLOAD"`
	Rate           float64           `help:"Fixed total rate in requests/s, paced by a schedule; latency is measured from each request's scheduled time. 0 means a closed loop." default:"0" env:"RATE"`
	Drain          time.Duration     `help:"How long to wait for outstanding answers once sending stops." default:"5s" env:"DRAIN"`
	ConnectTimeout time.Duration     `help:"Timeout of each connect." default:"5s" env:"CONNECT_TIMEOUT"`
	Seed           uint64            `help:"Seed of the random choice of targets, for repeatable runs." default:"1" env:"SEED"`

	TLSFlags `embed:""`
}

// Config checks the flags and turns them into a Config. Its errors name
// the flag at fault.
func (f *Flags) Config() (Config, error) {
	switch {
	case f.Conns < 1 || f.Conns > MaxConns:
		return Config{}, fmt.Errorf("--conns %d: want 1 to %d", f.Conns, MaxConns)
	case f.Depth < 0 || f.Depth > MaxDepth:
		return Config{}, fmt.Errorf("--depth %d: want 0 to %d", f.Depth, MaxDepth)
	case f.Requests == 0 && f.Duration <= 0:
		return Config{}, fmt.Errorf("--duration %s: want more than 0 (or give --requests)", f.Duration)
	case !(f.Rate >= 0) || f.Rate > MaxRate:
		return Config{}, fmt.Errorf("--rate %v: want 0 to 1e9 requests/s", f.Rate)
	case f.Drain < 0:
		return Config{}, fmt.Errorf("--drain %s: want 0 or more", f.Drain)
	case f.ConnectTimeout <= 0:
		return Config{}, fmt.Errorf("--connect-timeout %s: want more than 0", f.ConnectTimeout)
	}
	m, err := ParseMix(f.Mix)
	if err != nil {
		return Config{}, fmt.Errorf("--mix: %w", err)
	}
	def, err := ParseTemplate(f.Payload)
	if err != nil {
		return Config{}, fmt.Errorf("--payload: %w", err)
	}
	payloads := make([]Template, len(m.entries))
	for i := range payloads {
		payloads[i] = def
	}
	for name, tmpl := range f.TargetPayload {
		i := m.index(strings.ToUpper(name))
		if i < 0 {
			return Config{}, fmt.Errorf("--target-payload %s: target not in --mix %s", name, m)
		}
		if payloads[i], err = ParseTemplate(tmpl); err != nil {
			return Config{}, fmt.Errorf("--target-payload %s: %w", name, err)
		}
	}
	tlsConfig, err := f.ClientConfig()
	if err != nil {
		return Config{}, err
	}
	depth := f.Depth
	if depth == 0 {
		depth = 1
		if f.Rate > 0 {
			depth = RateDepth
		}
	}
	cfg := Config{
		Addr:        f.Addr,
		Conns:       f.Conns,
		Depth:       depth,
		Requests:    f.Requests,
		Rate:        f.Rate,
		Mix:         m,
		Payloads:    payloads,
		Drain:       f.Drain,
		DialTimeout: f.ConnectTimeout,
		Seed:        f.Seed,
		TLS:         tlsConfig,
	}
	if f.Requests == 0 {
		cfg.Duration = f.Duration
	}
	return cfg, nil
}
