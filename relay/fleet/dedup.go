package fleet

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/protocol"
)

// The duplicate-TXID shield's records in the store (docs/FLEET.md, "In the
// store"): one string key per transaction,
//
//	rh:{TARGET}:tx:TXID = 1|STATE|HASH|HUB|CODE|MESSAGE
//	rh:{TARGET}:idtx:IDENTITY:TXID = the same, for a client's own scope
//
// kept for the caller's ttl. IDENTITY is the scope's identity hash in 32
// lower-case hex digits, never the identity itself. The target's hash tag keeps a transaction in
// its target's Cluster slot. STATE is F (in flight), A (answered) or D (in
// doubt); HASH is the payload hash in 32 lower-case hex digits; CODE and
// MESSAGE are empty while in flight. MESSAGE comes last so that it may hold
// '|'.
const (
	txVersion = "1"
	// maxTxValueBytes bounds a record read from the store. The fleet's own
	// stay under 700 bytes (a 64-byte hub, a 512-byte message); anything
	// longer is not one of them and is never read out of Redis.
	maxTxValueBytes = 2048
)

// ErrBadDedupRecord is returned by DedupStore.Claim when the transaction's
// key holds something that is not a record of the fleet: garbage, a value
// too long, a key of another type. It is never taken for a record; the
// caller falls back to its own memory, and the next Settle of the
// transaction overwrites it.
var ErrBadDedupRecord = errors.New("fleet: stored transaction is not a record of the fleet")

// Scripts of the shield's records, each on one key.
var (
	// scriptTxClaim sets KEYS[1] to ARGV[1] for ARGV[2] ms unless it is
	// there; then it returns the record already there, read only when it
	// is a string of at most ARGV[3] bytes: {1} claimed, {0, value}, or
	// {-1, why}. One script, so that an expiry between the two steps cannot
	// leave the caller with neither.
	scriptTxClaim = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
local n = redis.pcall('STRLEN', KEYS[1])
if type(n) ~= 'number' then return {-1, 'wrong type'} end
if n > tonumber(ARGV[3]) then return {-1, 'too long'} end
return {0, redis.call('GET', KEYS[1])}`)

	// scriptTxRelease deletes KEYS[1] when it is ARGV[3] bytes long,
	// ARGV[1], lower-case hex digits, then ARGV[2]: the in-flight record of
	// one hub, whatever its hash. It returns how many keys it deleted.
	scriptTxRelease = redis.NewScript(`
local n = redis.pcall('STRLEN', KEYS[1])
if type(n) ~= 'number' or n ~= tonumber(ARGV[3]) then return 0 end
local v = redis.call('GET', KEYS[1])
local head, tail = #ARGV[1], #ARGV[2]
if string.sub(v, 1, head) == ARGV[1] and string.sub(v, -tail) == ARGV[2]
    and string.find(string.sub(v, head + 1, n - tail), '^[0-9a-f]+$') then
  return redis.call('DEL', KEYS[1])
end
return 0`)
)

// DedupStore is the duplicate-TXID shield's store (dedup.Store) in the
// fleet's Redis, so that a resend to any hub of the fleet finds the
// transaction. Each command is bounded by the fleet's OpTimeout as well as
// by the caller's context. It counts its failed commands and the content it
// refuses in relay_state_store_errors_total, but does not change whether
// the fleet counts the store as up: the sync loop alone decides that. It
// works from New until Close, and is safe for concurrent use.
type DedupStore struct {
	f *Fleet
}

var _ dedup.Store = (*DedupStore)(nil)

// Dedup returns the fleet's store for the duplicate-TXID shield.
func (f *Fleet) Dedup() *DedupStore {
	return &DedupStore{f: f}
}

// Claim stores rec, which must be InFlight, as target's txid in scope for ttl,
// unless a record is there already: then it returns that record and false.
// A key holding something else than a record is ErrBadDedupRecord.
func (s *DedupStore) Claim(ctx context.Context, target string, scope dedup.Scope, txid string, rec dedup.Record, ttl time.Duration) (dedup.Record, bool, error) {
	key, err := txKey(target, scope, txid)
	if err != nil {
		return dedup.Record{}, false, err
	}
	if rec.State != dedup.InFlight {
		return dedup.Record{}, false, fmt.Errorf("fleet: claim %s: state %s, want in_flight", target, rec.State)
	}
	value, err := appendTxRecord(nil, rec)
	if err != nil {
		return dedup.Record{}, false, fmt.Errorf("fleet: claim %s: %w", target, err)
	}
	ttl, err = roundTTL(ttl)
	if err != nil {
		return dedup.Record{}, false, fmt.Errorf("fleet: claim %s: %w", target, err)
	}
	opCtx, cancel := context.WithTimeout(ctx, s.f.opTimeout)
	defer cancel()
	reply, err := scriptTxClaim.Run(opCtx, s.f.client, []string{key}, value, ttl.Milliseconds(), maxTxValueBytes).Slice()
	if err != nil {
		s.failed(ctx)
		return dedup.Record{}, false, fmt.Errorf("fleet: claim %s: %w", target, err)
	}
	code, _ := reply[0].(int64)
	switch {
	case code == 1 && len(reply) == 1:
		return dedup.Record{}, true, nil
	case code == 0 && len(reply) == 2:
		v, _ := reply[1].(string)
		existing, err := decodeTxRecord(v)
		if err != nil {
			s.refused(target, "not a record", len(v))
			return dedup.Record{}, false, fmt.Errorf("fleet: claim %s: %w", target, err)
		}
		return existing, false, nil
	case code == -1 && len(reply) == 2:
		why, _ := reply[1].(string)
		s.refused(target, why, 0)
		return dedup.Record{}, false, fmt.Errorf("fleet: claim %s: %w", target, ErrBadDedupRecord)
	default:
		return dedup.Record{}, false, fmt.Errorf("fleet: claim %s: %w", target, errBadReply)
	}
}

// Settle replaces target's txid in scope with rec for ttl, whatever was there:
// Answered or InDoubt, or InFlight for a hub that takes over a transaction
// in doubt once its target said it never applied it. The message is
// stored as a client is answered with it (control characters as spaces,
// cut to protocol.MaxMessageBytes), which keeps the record bounded and its
// replay the same answer.
func (s *DedupStore) Settle(ctx context.Context, target string, scope dedup.Scope, txid string, rec dedup.Record, ttl time.Duration) error {
	key, err := txKey(target, scope, txid)
	if err != nil {
		return err
	}
	value, err := appendTxRecord(nil, rec)
	if err != nil {
		return fmt.Errorf("fleet: settle %s: %w", target, err)
	}
	if ttl, err = roundTTL(ttl); err != nil {
		return fmt.Errorf("fleet: settle %s: %w", target, err)
	}
	opCtx, cancel := context.WithTimeout(ctx, s.f.opTimeout)
	defer cancel()
	if err := s.f.client.Set(opCtx, key, value, ttl).Err(); err != nil {
		s.failed(ctx)
		return fmt.Errorf("fleet: settle %s: %w", target, err)
	}
	return nil
}

// Release deletes target's txid in scope when it is still the InFlight record hub
// claimed; a record settled since, or claimed by another hub, stays.
func (s *DedupStore) Release(ctx context.Context, target string, scope dedup.Scope, txid, hub string) error {
	key, err := txKey(target, scope, txid)
	if err != nil {
		return err
	}
	if !ValidName(hub) {
		return fmt.Errorf("fleet: release %s: hub %q: want 1 to 64 of A-Z a-z 0-9 . _ : -", target, hub)
	}
	prefix := txVersion + "|F|"
	suffix := "|" + hub + "||"
	opCtx, cancel := context.WithTimeout(ctx, s.f.opTimeout)
	defer cancel()
	err = scriptTxRelease.Run(opCtx, s.f.client, []string{key}, prefix, suffix, len(prefix)+2*len(dedup.Hash{})+len(suffix)).Err()
	if err != nil {
		s.failed(ctx)
		return fmt.Errorf("fleet: release %s: %w", target, err)
	}
	return nil
}

// failed counts a command the store failed or did not answer in time, and
// has a Redis Cluster client read the cluster's layout again; one given up
// because the caller's ctx ended is not the store's failure.
func (s *DedupStore) failed(ctx context.Context) {
	if ctx.Err() == nil {
		s.f.metrics.commandFailed()
		s.f.relearn()
	}
}

// refused counts and logs a transaction's key whose content is not a
// record. The TXID is the client's and stays out of the log.
func (s *DedupStore) refused(target, why string, n int) {
	s.f.metrics.contentIgnored()
	ev := s.f.warnLog.Warn().Str("target", target).Str("why", why)
	if n > 0 {
		ev = ev.Int("bytes", n)
	}
	ev.Msg("state store transaction record is not the fleet's; ignored")
}

// txKey returns the key of target's txid in scope, or an error when
// either could break out of the key's layout.
func txKey(target string, scope dedup.Scope, txid string) (string, error) {
	if !ValidName(target) || target != strings.ToUpper(target) {
		return "", fmt.Errorf("fleet: target %q: want a canonical (upper-case) target name", target)
	}
	if !protocol.ValidTxID([]byte(txid)) {
		return "", fmt.Errorf("fleet: %s: TXID %q: want 1 to 64 of A-Z a-z 0-9 . _ : -", target, txid)
	}
	if id, ok := scope.Client(); ok {
		return keyPrefix + "{" + target + "}:idtx:" + hex.EncodeToString(id[:]) + ":" + txid, nil
	}
	return keyPrefix + "{" + target + "}:tx:" + txid, nil
}

// roundTTL returns ttl rounded up to whole milliseconds, as PX takes it.
func roundTTL(ttl time.Duration) (time.Duration, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("ttl %v: want above zero", ttl)
	}
	return (ttl + time.Millisecond - 1).Truncate(time.Millisecond), nil
}

// Letters of the states in a record.
const (
	txInFlight = 'F'
	txAnswered = 'A'
	txInDoubt  = 'D'
)

// appendTxRecord appends rec as the store keeps it. Only what decodes
// again is written: a hub that is a valid name, no code or message while in
// flight, a target's code once settled.
func appendTxRecord(b []byte, rec dedup.Record) ([]byte, error) {
	var letter byte
	switch rec.State {
	case dedup.InFlight:
		letter = txInFlight
		if rec.Code != "" || rec.Message != "" {
			return nil, errors.New("an in-flight record has no answer")
		}
	case dedup.Answered:
		letter = txAnswered
	case dedup.InDoubt:
		letter = txInDoubt
	default:
		return nil, fmt.Errorf("state %s cannot be stored", rec.State)
	}
	if rec.State != dedup.InFlight && !protocol.ValidTargetCode(rec.Code) {
		return nil, fmt.Errorf("code %q: want 0000, Bnnn or Ennn", rec.Code)
	}
	if !ValidName(rec.Hub) {
		return nil, fmt.Errorf("hub %q: want 1 to 64 of A-Z a-z 0-9 . _ : -", rec.Hub)
	}
	b = append(b, txVersion...)
	b = append(b, '|', letter, '|')
	b = hex.AppendEncode(b, rec.Hash[:])
	b = append(b, '|')
	b = append(b, rec.Hub...)
	b = append(b, '|')
	b = append(b, rec.Code...)
	b = append(b, '|')
	return protocol.AppendMessage(b, rec.Message), nil
}

// decodeTxRecord reads a record as appendTxRecord writes it, strictly:
// whatever else v holds is ErrBadDedupRecord, never a record.
func decodeTxRecord(v string) (dedup.Record, error) {
	var rec dedup.Record
	if len(v) > maxTxValueBytes {
		return rec, ErrBadDedupRecord
	}
	version, rest, ok1 := strings.Cut(v, "|")
	state, rest, ok2 := strings.Cut(rest, "|")
	hash, rest, ok3 := strings.Cut(rest, "|")
	hub, rest, ok4 := strings.Cut(rest, "|")
	code, msg, ok5 := strings.Cut(rest, "|")
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || version != txVersion || len(state) != 1 ||
		len(hash) != 2*len(rec.Hash) || !ValidName(hub) || len(msg) > protocol.MaxMessageBytes {
		return dedup.Record{}, ErrBadDedupRecord
	}
	switch state[0] {
	case txInFlight:
		rec.State = dedup.InFlight
	case txAnswered:
		rec.State = dedup.Answered
	case txInDoubt:
		rec.State = dedup.InDoubt
	default:
		return dedup.Record{}, ErrBadDedupRecord
	}
	if rec.State == dedup.InFlight && (code != "" || msg != "") ||
		rec.State != dedup.InFlight && !protocol.ValidTargetCode(code) {
		return dedup.Record{}, ErrBadDedupRecord
	}
	// Lower case only, as written: hex.Decode alone would take upper case.
	for i := 0; i < len(hash); i++ {
		if c := hash[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return dedup.Record{}, ErrBadDedupRecord
		}
	}
	_, _ = hex.Decode(rec.Hash[:], []byte(hash))
	// Control characters too, as appendTxRecord never writes them.
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c == 0x7f {
			return dedup.Record{}, ErrBadDedupRecord
		}
	}
	rec.Hub, rec.Code, rec.Message = hub, code, msg
	return rec, nil
}
