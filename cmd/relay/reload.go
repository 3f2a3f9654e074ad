package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/settingsfile"
	"github.com/relayhub/relayhub/relay/statuspage"
)

// reloader re-reads the settings file (--config) and applies it to the
// running hub, for SIGHUP and the admin port's POST /reload. The flags and
// the environment are read once, at start: a reload takes the file over
// the same defaults and --target list. It is safe for concurrent use;
// reloads are applied one at a time.
type reloader struct {
	path     string               // --config; empty when there is none
	defaults relay.TargetSettings // the flags' settings, every target's defaults
	base     []relay.Target       // the --target list
	// mutualTLS says the client port verifies client certificates
	// (--tls-client-ca), which allowed_clients needs.
	mutualTLS bool
	log       zerolog.Logger
	// rec, the status page's Recorder, hears of every reload applied; nil
	// without the page. Set before srv is stored, and read only after srv
	// is loaded.
	rec *statuspage.Recorder
	srv atomic.Pointer[relay.Server] // nil until the hub is built
	// mu is held through a reload, so that rec hears of reloads in the
	// order the hub applied them.
	mu sync.Mutex
}

// baseTargets returns the --target list as the relay takes it.
func baseTargets(c *cli) []relay.Target {
	targets := make([]relay.Target, len(c.Target))
	for i, t := range c.Target {
		targets[i] = relay.Target(t)
	}
	return targets
}

// errStarting is what a reload gets before the hub is built.
var errStarting = errors.New("the relay is still starting")

// reload re-reads the settings file and applies it, logging the outcome in
// one line: "settings reloaded" with the targets added, removed and
// changed, or "settings reload refused; running settings unchanged" with
// why. trigger says what asked for it (SIGHUP, POST /reload).
func (rl *reloader) reload(trigger string) (relay.ReloadResult, error) {
	if rl.path == "" {
		return relay.ReloadResult{}, fmt.Errorf("the relay runs without --config: %w", admin.ErrNothingToReload)
	}
	srv := rl.srv.Load()
	if srv == nil {
		return relay.ReloadResult{}, errStarting
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	targets, err := settingsfile.Load(rl.path, rl.defaults, rl.base)
	if err == nil {
		err = checkAllowedClients(rl.path, rl.mutualTLS, targets)
	}
	var res relay.ReloadResult
	// The relay's breakers run on the real clock: read it before the
	// reload, so that the Recorder keeps every change of a target added.
	at := time.Now()
	if err == nil {
		res, err = srv.Reload(targets)
	}
	if err != nil {
		rl.log.Error().Err(err).Str("config", rl.path).Str("trigger", trigger).Msg("settings reload refused; running settings unchanged")
		return relay.ReloadResult{}, err
	}
	if rl.rec != nil {
		rl.rec.Reloaded(res, at)
	}
	rl.log.Info().Str("config", rl.path).Str("trigger", trigger).
		Strs("added", res.Added).Strs("removed", res.Removed).Strs("changed", res.Changed).Msg("settings reloaded")
	warnInsecureTargets(rl.log, targets)
	return res, nil
}

// reloadOnHangup is reload for SIGHUP: without a settings file, or before
// the hub is built, there is nothing to reload and nothing is logged.
func (rl *reloader) reloadOnHangup() {
	if rl.path != "" && rl.srv.Load() != nil {
		_, _ = rl.reload("SIGHUP")
	}
}

// reloadForAdmin is reload for POST /reload.
func (rl *reloader) reloadForAdmin() (relay.ReloadResult, error) {
	return rl.reload("POST /reload")
}

// onHangup runs actions, in order, on every SIGHUP until the returned stop
// is called: the relay's one SIGHUP handler, which reopens its logs for
// logrotate (docs/OPERATING.md) and reloads its settings. Catching SIGHUP
// also keeps it from ending the relay, Go's default. stop waits for the
// actions in progress; call it before closing what they use.
func onHangup(actions ...func()) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { hangupLoop(hup, done, actions) })
	return func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	}
}

// hangupLoop runs actions for each signal on hup until done is closed.
func hangupLoop(hup <-chan os.Signal, done <-chan struct{}, actions []func()) {
	for {
		select {
		case <-hup:
			for _, act := range actions {
				act()
			}
		case <-done:
			return
		}
	}
}

// reopener is a file the relay appends to that SIGHUP reopens at its path
// for logrotate: the breaker log, the access log, the in-doubt journal.
type reopener interface {
	Reopen() error
	Path() string
}

// reopenLog reopens f, logging the outcome with f's path under key: "NAME
// reopened", or "NAME reopen failed; still writing to the old file", as
// a failed reopen leaves f in the file it had.
func reopenLog(name, key string, f reopener, logger zerolog.Logger) {
	if err := f.Reopen(); err != nil {
		logger.Error().Err(err).Str(key, f.Path()).Msg(name + " reopen failed; still writing to the old file")
		return
	}
	logger.Info().Str(key, f.Path()).Msg(name + " reopened")
}

// adminToken is the admin port's bearer token: --admin-token, or the
// content of --admin-token-file, which SIGHUP re-reads so that the token
// can be rotated without a restart. It is safe for concurrent use.
type adminToken struct {
	file string // --admin-token-file; empty when the token is not in a file
	log  zerolog.Logger

	mu      sync.Mutex
	token   string         // guarded by mu: the token in force; empty for none
	handler *admin.Handler // guarded by mu: the admin port's, nil until it is built
}

// newAdminToken returns the token the flags give, reading
// --admin-token-file when it is set; its error names the flag.
func newAdminToken(c *cli, logger zerolog.Logger) (*adminToken, error) {
	t := &adminToken{file: c.AdminTokenFile, log: logger, token: c.AdminToken}
	if t.file != "" {
		token, err := admin.ReadTokenFile(t.file)
		if err != nil {
			return nil, fmt.Errorf("--admin-token-file: %w", err)
		}
		t.token = token
	}
	return t, nil
}

// value returns the token in force; empty for none.
func (t *adminToken) value() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.token
}

// attach makes h, the admin port's handler built with value(), follow the
// token from now on. A token re-read in between is handed to it at once.
func (t *adminToken) attach(h *admin.Handler) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.handler = h
	if t.token != "" {
		t.setLocked(t.token)
	}
}

// rereadOnHangup is the SIGHUP action of --admin-token-file: it reads the
// file again and gives the admin port its token, logging "admin token file
// re-read" with whether the token changed; a file it cannot take (gone,
// empty, open to group or others) is logged, "admin token file refused;
// the token in force stays", and the token in force does stay. Without
// the file there is nothing to do.
func (t *adminToken) rereadOnHangup() {
	if t.file == "" {
		return
	}
	token, err := admin.ReadTokenFile(t.file)
	if err != nil {
		t.log.Error().Err(err).Str("admin_token_file", t.file).Msg("admin token file refused; the token in force stays")
		return
	}
	t.mu.Lock()
	changed := token != t.token
	t.token = token
	if t.handler != nil {
		t.setLocked(token)
	}
	t.mu.Unlock()
	t.log.Info().Str("admin_token_file", t.file).Bool("changed", changed).Msg("admin token file re-read")
}

// setLocked hands token to the admin port's handler; t.mu is held and the
// handler is set.
func (t *adminToken) setLocked(token string) {
	if err := t.handler.SetToken(token); err != nil {
		// The handler was built with a token and token is not empty.
		t.log.Error().Err(err).Msg("admin token not applied")
	}
}
