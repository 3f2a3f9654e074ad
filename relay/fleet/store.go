package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// The store's layout (docs/FLEET.md, "In the store"). Every key of a target
// carries the target's name as a hash tag, so that each script touches one
// Redis Cluster slot; the duplicate-TXID shield's records (dedup.go) too.
const (
	keyPrefix = "rh:"
	// Channel is the one pub/sub channel every change is announced on.
	Channel = "rh:changes"
	// recordTTL is how long an open record outlives its open period: long
	// enough that a hub started in the probe stage learns the fleet is
	// still open, short enough that a fleet stopped for good leaves nothing
	// behind for ever.
	recordTTL = 24 * time.Hour
)

// keys returns the target's keys, in the order the scripts take them:
// the open record, the epoch counter, the probe lease, the manual mode.
func keys(target string) []string {
	tag := keyPrefix + "{" + target + "}:"
	return []string{tag + "open", tag + "epoch", tag + "probe", tag + "manual"}
}

// luaCommon is the head of every script. Bounds on what is read keep
// hostile content (a huge value, a key of the wrong type, garbage) from
// being taken for state: it is reported in the state's "bad" field and
// overwritten by the next write.
var luaCommon = `
local K_OPEN, K_EPOCH, K_PROBE, K_MANUAL = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local CHANNEL, TARGET, HUB, KNOWN, STAMP = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local RECORD_TTL = ` + strconv.FormatInt(recordTTL.Milliseconds(), 10) + `

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n) return string.format('%.0f', n) end

-- str returns a string key's value ('' when absent) and whether the key
-- holds something other than a string of at most limit bytes.
local function str(key, limit)
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then
    if #v > limit then return '', true end
    return v, false
  end
  if type(v) == 'table' and v.err then return '', true end
  return '', false
end

local function epoch()
  local v, bad = str(K_EPOCH, 15)
  if v == '' then return 0, bad end
  if not string.match(v, '^%d+$') then return 0, true end
  return tonumber(v), false
end

local function record()
  local v, bad = str(K_OPEN, 256)
  if v == '' then return nil, bad end
  local e, hub, reason, period, untl, held = string.match(v, '^(%d+)|([%w%.:_%-]+)|(%a+)|(%d+)|(%d+)|([01])$')
  if not e or #e > 15 or #period > 15 or #untl > 15 or #hub > 64 or #reason > 16 then return nil, true end
  return {epoch = tonumber(e), hub = hub, reason = reason, period = tonumber(period), untl = tonumber(untl), held = held == '1'}, false
end

-- left returns what is left of rec's open period by the store's clock, for
-- a hub that adopts it, at most twice the period it was written with (the
-- longest a period can be, jitter included): a step back of the store
-- host's clock holds no hub open for longer than that (docs/FLEET.md,
-- "Clocks").
local function left(rec)
  local rem = rec.untl - now_ms()
  if rem < 0 then return 0 end
  return math.min(rem, 2 * rec.period)
end

local function state(code, wait)
  local e, bad_e = epoch()
  local rec, bad_r = record()
  local manual, bad_m = str(K_MANUAL, 16)
  local holder, bad_p = str(K_PROBE, 64)
  local bad = {}
  if bad_e then bad[#bad + 1] = 'epoch' end
  if bad_r then bad[#bad + 1] = 'open' end
  if bad_m or (manual ~= '' and manual ~= 'disabled') then bad[#bad + 1] = 'manual' end
  if bad_p then bad[#bad + 1] = 'probe' end
  local out = {code, wait, e, table.concat(bad, ','), 0, 0, '', '', 0, 0, 0, 0, holder}
  if rec then
    out[5], out[6], out[7], out[8], out[9], out[10] = 1, rec.epoch, rec.hub, rec.reason, rec.period, left(rec)
    if rec.held then out[11] = 1 end
  end
  if manual == 'disabled' then out[12] = 1 end
  return out
end

-- bump moves the epoch past both the store's and the caller's, so that no
-- hub ever takes the new state for one it has seen, even after the store
-- lost its memory.
local function bump()
  local e = epoch()
  local n = math.max(e, KNOWN) + 1
  redis.call('SET', K_EPOCH, fmt(n))
  return n
end

local function write_record(e, reason, period, remaining, held)
  local v = table.concat({fmt(e), HUB, reason, fmt(period), fmt(now_ms() + remaining), held and '1' or '0'}, '|')
  if held then
    redis.call('SET', K_OPEN, v)
  else
    redis.call('SET', K_OPEN, v, 'PX', fmt(remaining + RECORD_TTL))
  end
end

local function publish(e, kind)
  redis.call('PUBLISH', CHANNEL, table.concat({'v1', TARGET, fmt(e), kind, HUB, STAMP}, '|'))
end
`

// Scripts, each one atomic over one target's keys. ARGV is common to all:
// channel, target, hub, the epoch the hub knows, the change's time stamp in
// µs; the script's own arguments follow. Each returns its code, a wait in
// ms, and the target's state after it ran (see decodeState).
var (
	// scriptRead returns the state.
	scriptRead = redis.NewScript(luaCommon + `return state(1, 0)`)

	// scriptOpen opens the fleet's breaker after a local trip, or returns
	// code 0 and the open record already there, to adopt. A reopen (a
	// failed probe) of the open period the hub knows starts a new one.
	// ARGV[6] reopen 0|1, [7] reason, [8] base period ms, [9] remaining ms.
	scriptOpen = redis.NewScript(luaCommon + `
local rec = record()
if rec and not (ARGV[6] == '1' and rec.epoch == KNOWN) then return state(0, 0) end
local n = bump()
write_record(n, ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), false)
redis.call('DEL', K_PROBE)
publish(n, 'open')
return state(1, 0)`)

	// scriptClose closes the fleet's breaker after a successful probe, if
	// the epoch is still the one the hub knows; else code 0 and the state.
	scriptClose = redis.NewScript(luaCommon + `
local e, bad = epoch()
if e ~= KNOWN and not bad then return state(0, 0) end
local n = bump()
redis.call('DEL', K_OPEN, K_PROBE)
publish(n, 'close')
return state(1, 0)`)

	// scriptLease takes or renews the probe lease once the fleet's open
	// period has passed by the asking hub's own clock (a hub asks only
	// then, and only for the epoch it adopted, whose remaining time it
	// measures itself; the store's wall clock is not asked again): code 1
	// when the hub holds it; 0 and how long to wait when another hub does
	// or an operator holds the breaker open; -1 when the epoch is not the
	// one the hub knows. ARGV[6] lease ms.
	scriptLease = redis.NewScript(luaCommon + `
local lease = tonumber(ARGV[6])
local e = epoch()
if e ~= KNOWN then return state(-1, 0) end
local rec = record()
if rec and rec.held then return state(0, lease) end
local holder, bad = str(K_PROBE, 64)
if holder == HUB then
  redis.call('PEXPIRE', K_PROBE, lease)
  return state(1, 0)
end
if holder ~= '' then
  local ttl = redis.call('PTTL', K_PROBE)
  if ttl < 0 then
    redis.call('PEXPIRE', K_PROBE, lease)
    ttl = lease
  end
  return state(0, ttl)
end
redis.call('SET', K_PROBE, HUB, 'PX', lease)
return state(1, 0)`)

	// scriptControl applies an operator's action fleet-wide. ARGV[6]
	// action, [7] base period ms, [8] remaining ms (for enable).
	scriptControl = redis.NewScript(luaCommon + `
local a = ARGV[6]
local rec = record()
local n = bump()
redis.call('DEL', K_PROBE)
if a == 'open' then
  write_record(n, 'operator', tonumber(ARGV[7]), 0, true)
  redis.call('DEL', K_MANUAL)
elseif a == 'close' then
  redis.call('DEL', K_OPEN, K_MANUAL)
elseif a == 'disable' then
  redis.call('DEL', K_OPEN)
  redis.call('SET', K_MANUAL, 'disabled')
elseif a == 'enable' then
  redis.call('DEL', K_MANUAL)
  if rec and rec.held then write_record(n, 'operator', tonumber(ARGV[7]), tonumber(ARGV[8]), false) end
end
publish(n, 'operator-' .. a)
return state(1, 0)`)
)

// storeState is one target's state in the store, as a script returns it.
// It is a plain value.
type storeState struct {
	code int64         // the script's own result
	wait time.Duration // how long to wait before asking again, for scriptLease
	// epoch is the target's epoch counter; bad lists the keys whose
	// content is not the fleet's (garbage, too long, the wrong type),
	// comma-separated, empty when all are well.
	epoch int64
	bad   string
	// open reports an open record; the fields after it describe it.
	open      bool
	recEpoch  int64
	openedBy  string
	reason    string
	period    time.Duration
	remaining time.Duration // of the open period, by the store's clock; 0 once passed
	held      bool          // held open by an operator
	disabled  bool          // disabled by an operator
	holder    string        // hub holding the probe lease; empty when none
}

// errBadReply is a script reply that is not the fleet's: a store that is
// not Redis, or scripts changed under a running hub.
var errBadReply = errors.New("fleet: store reply is not a state")

// decodeState reads a script's reply: {code, wait_ms, epoch, bad, open,
// rec_epoch, opened_by, reason, period_ms, remaining_ms, held, disabled,
// holder}.
func decodeState(reply any) (storeState, error) {
	a, ok := reply.([]any)
	if !ok || len(a) != 13 {
		return storeState{}, errBadReply
	}
	var (
		st   storeState
		nums [9]int64
		strs [3]string
	)
	for i, at := range []int{0, 1, 2, 4, 5, 8, 9, 10, 11} {
		n, ok := a[at].(int64)
		if !ok {
			return storeState{}, errBadReply
		}
		nums[i] = n
	}
	for i, at := range []int{3, 6, 7} {
		s, ok := a[at].(string)
		if !ok {
			return storeState{}, errBadReply
		}
		strs[i] = s
	}
	holder, ok := a[12].(string)
	if !ok {
		return storeState{}, errBadReply
	}
	st.code, st.wait, st.epoch = nums[0], time.Duration(nums[1])*time.Millisecond, nums[2]
	st.open, st.recEpoch = nums[3] == 1, nums[4]
	st.period, st.remaining = time.Duration(nums[5])*time.Millisecond, time.Duration(nums[6])*time.Millisecond
	st.held, st.disabled = nums[7] == 1, nums[8] == 1
	st.bad, st.openedBy, st.reason, st.holder = strs[0], strs[1], strs[2], holder
	return st, nil
}

// ValidateStoreURL reports whether raw is a state store URL that New can
// use: redis:// or rediss:// with a host, as go-redis parses it.
func ValidateStoreURL(raw string) error {
	c, err := newClient(raw, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// newClient returns a go-redis client for the store at raw:
//
//   - redis://[user:pass@]host:port/db (rediss:// for TLS): one server;
//   - with ?master_name=NAME: Sentinel, host:port and each addr= being a
//     sentinel;
//   - with one or more ?addr=host:port: Redis Cluster, host:port and each
//     addr= being a seed node.
//
// What the URL does not set is tuned for the fleet (see knobs.tune).
// Nothing is dialled until the first command.
func newClient(raw string, opTimeout time.Duration) (redis.UniversalClient, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("state store URL does not parse")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("state store URL %q: want redis:// or rediss://", redact(u))
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("state store URL %q: want a host", redact(u))
	}
	var (
		k     knobs
		build func() redis.UniversalClient
	)
	switch q := u.Query(); {
	case q.Has("master_name"):
		o, err := redis.ParseFailoverURL(raw)
		if err != nil {
			return nil, badStoreURL(u, err)
		}
		k = knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.DialerRetries, &o.Protocol, &o.DisableIdentity, nil}
		build = func() redis.UniversalClient { return redis.NewFailoverClient(o) }
	case q.Has("addr"):
		o, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, badStoreURL(u, err)
		}
		k = knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.DialerRetries, &o.Protocol, &o.DisableIdentity, &o.MaintNotificationsConfig}
		build = func() redis.UniversalClient { return redis.NewClusterClient(o) }
	default:
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, badStoreURL(u, err)
		}
		k = knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.MaxRetries, &o.DialerRetries, &o.Protocol, &o.DisableIdentity, &o.MaintNotificationsConfig}
		build = func() redis.UniversalClient { return redis.NewClient(o) }
	}
	k.tune(opTimeout)
	return build(), nil
}

// badStoreURL is the error of a URL go-redis refused.
func badStoreURL(u *url.URL, err error) error {
	return fmt.Errorf("state store URL %q: %w", redact(u), err)
}

// knobs point at the options of a go-redis client that the fleet sets
// where the URL set nothing. maint is nil for a client without
// maintenance notifications. Not for concurrent use: it is filled and
// applied once, by newClient.
type knobs struct {
	dial, read, write          *time.Duration
	retries, dialRetries, resp *int
	noIdentity                 *bool
	maint                      **maintnotifications.Config
}

// tune fills in the fleet's defaults: every timeout opTimeout, no command
// retried (the fleet's loop retries, and a command must never wait long),
// one dial attempt, RESP2, and none of the handshake extras that older
// servers refuse.
func (k knobs) tune(opTimeout time.Duration) {
	for _, d := range []*time.Duration{k.dial, k.read, k.write} {
		if *d == 0 {
			*d = opTimeout
		}
	}
	if *k.retries == 0 {
		*k.retries = -1 // go-redis: no retries
	}
	if *k.dialRetries == 0 {
		*k.dialRetries = 1
	}
	if *k.resp == 0 {
		*k.resp = 2
	}
	*k.noIdentity = true
	if k.maint != nil {
		*k.maint = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	}
}

// redact returns u as text without its password, for messages and logs.
func redact(u *url.URL) string {
	return u.Redacted()
}

// runScript runs s for target t with the common arguments and extra ones,
// bounded by timeout, and decodes the state it returns.
func (f *Fleet) runScript(ctx context.Context, s *redis.Script, t *target, stamp int64, extra ...any) (storeState, error) {
	ctx, cancel := context.WithTimeout(ctx, f.opTimeout)
	defer cancel()
	args := append([]any{Channel, t.name, f.hubID, strconv.FormatInt(t.known, 10), strconv.FormatInt(stamp, 10)}, extra...)
	reply, err := s.Run(ctx, f.client, t.keys, args...).Result()
	if err != nil {
		return storeState{}, err
	}
	return decodeState(reply)
}

// msText renders d in whole milliseconds, as the scripts take durations.
func msText(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 0), 10)
}

// splitBad returns the keys a state's bad field names.
func splitBad(bad string) []string {
	if bad == "" {
		return nil
	}
	return strings.Split(bad, ",")
}
