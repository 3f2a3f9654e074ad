// Package dedup is the duplicate-TXID shield: for each target and TXID it
// remembers whether a transaction is in flight, answered or in doubt, so
// that a client's resend joins the first call or gets its answer instead of
// making a second call. It knows nothing of connections or of the targets'
// protocol; docs/PROTOCOL.md ("Resending a transaction") gives the rules a
// client sees.
package dedup

import (
	"crypto/sha256"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxEntries bounds the TXIDs a Shield remembers when
// Config.MaxEntries is zero.
const DefaultMaxEntries = 1_000_000

// DefaultWindow is how long an answer is remembered when a target's
// window is zero.
const DefaultWindow = 10 * time.Minute

// Hash identifies a payload: the first 16 bytes of its SHA-256, stable
// across hubs so that a fleet compares the same value.
type Hash [16]byte

// HashPayload returns payload's Hash.
func HashPayload(payload []byte) Hash {
	sum := sha256.Sum256(payload)
	return Hash(sum[:16])
}

// State is what is known of a remembered transaction.
type State uint8

// States of a transaction.
const (
	// Absent: nothing is remembered.
	Absent State = iota
	// InFlight: a call (or a look-up of its outcome) is under way.
	InFlight
	// Answered: the target answered; the answer is kept.
	Answered
	// InDoubt: the call may have reached the target and its outcome is
	// unknown.
	InDoubt
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case InFlight:
		return "in_flight"
	case Answered:
		return "answered"
	case InDoubt:
		return "in_doubt"
	default:
		return "absent"
	}
}

// Verdict is what Begin decided for a request.
type Verdict uint8

// Verdicts of Begin.
const (
	// Claimed: nothing was remembered; the caller now leads the call and
	// must end its Flight with Settle or Forget.
	Claimed Verdict = iota
	// Joined: the same transaction is in flight; the waiter will be given
	// the leader's answer by the leader.
	Joined
	// Replayed: the transaction was answered; Begin returned the answer.
	Replayed
	// Conflict: the TXID is remembered with another payload.
	Conflict
	// Resolve: the transaction is in doubt; the caller now leads the
	// look-up of its outcome (later copies join it) and must end its
	// Flight with Settle or Forget.
	Resolve
)

// Waiter is a copy of a request that joined a flight: the flight's leader
// hands it the answer.
type Waiter interface {
	Answer(code string, msg []byte)
}

// Config configures a Shield. The zero value is usable.
type Config struct {
	// MaxEntries bounds the transactions remembered; past it the oldest
	// is forgotten first, and counted (Evictions). Zero means
	// DefaultMaxEntries.
	MaxEntries int
	// Now is the clock of the windows. Nil means time.Now.
	Now func() time.Time
}

// shardCount spreads the entries over locks: a request locks one shard.
const shardCount = 64

// Shield remembers transactions by target and TXID. It is safe for
// concurrent use.
type Shield struct {
	now       func() time.Time
	seed      maphash.Seed
	evictions atomic.Int64
	entries   atomic.Int64
	shards    [shardCount]shard
}

// New returns a Shield configured by cfg.
func New(cfg Config) *Shield {
	s := &Shield{now: cfg.Now, seed: maphash.MakeSeed()}
	if s.now == nil {
		s.now = time.Now
	}
	limit := cfg.MaxEntries
	if limit <= 0 {
		limit = DefaultMaxEntries
	}
	perShard := max((limit+shardCount-1)/shardCount, 1)
	for i := range s.shards {
		s.shards[i].limit = uint32(perShard)
		s.shards[i].index = make(map[string]uint32)
	}
	return s
}

// Evictions returns how many remembered transactions were forgotten to
// keep within MaxEntries.
func (s *Shield) Evictions() int64 { return s.evictions.Load() }

// Len returns how many transactions are remembered, expired ones not yet
// swept included.
func (s *Shield) Len() int64 { return s.entries.Load() }

// Flight is a claimed transaction: the call or look-up its leader makes,
// and the copies waiting for its answer. Only its leader uses it.
type Flight struct {
	shard   *shard
	seq     uint32
	hash    Hash
	waiters []Waiter // guarded by shard.mu
}

// Hash returns the payload hash the flight was claimed with.
func (f *Flight) Hash() Hash { return f.hash }

// Begin looks up target's txid, whose payload hashes to h. Absent or
// expired, it is claimed (Claimed, with its Flight); in flight with the
// same payload, the Waiter join returns joins it (Joined; join is called
// under the Shield's lock, and only then); answered within its window, its
// answer comes back (Replayed, code and message); in doubt, the caller
// claims its look-up (Resolve, with its Flight); remembered with another
// payload, Conflict. window is how long a settled answer is kept.
func (s *Shield) Begin(target string, txid []byte, h Hash, join func() Waiter) (v Verdict, f *Flight, code, msg string) {
	var keyBuf [160]byte
	key := appendKey(keyBuf[:0], target, txid)
	sh := &s.shards[maphash.Bytes(s.seed, key)%shardCount]
	now := s.now().UnixNano()

	sh.mu.Lock()
	defer sh.mu.Unlock()
	if seq, ok := sh.index[string(key)]; ok {
		e := sh.at(seq)
		if e.flight == nil && e.expires <= now {
			sh.remove(seq, e)
			s.entries.Add(-1)
		} else {
			if e.hash != h {
				return Conflict, nil, "", ""
			}
			switch {
			case e.flight != nil:
				e.flight.waiters = append(e.flight.waiters, join())
				return Joined, nil, "", ""
			case e.state == Answered:
				return Replayed, nil, e.code(), e.message()
			default: // InDoubt
				e.flight = &Flight{shard: sh, seq: seq, hash: h}
				return Resolve, e.flight, "", ""
			}
		}
	}
	f = &Flight{shard: sh, hash: h}
	f.seq = s.insert(sh, string(key), h, now)
	sh.at(f.seq).flight = f
	return Claimed, f, "", ""
}

// Settle ends f with what became of its transaction, Answered or InDoubt
// with the answer its copies get, remembered for window from now. It
// returns the copies that joined f, for the caller to answer.
func (s *Shield) Settle(f *Flight, st State, code string, msg []byte, window time.Duration) []Waiter {
	sh := f.shard
	now := s.now().UnixNano()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.owned(f); ok {
		// The index's key moves to the new text, so that the entry again
		// costs one string.
		delete(sh.index, e.text[:e.keyLen])
		e.text = e.text[:e.keyLen] + code + string(msg)
		sh.index[e.text[:e.keyLen]] = f.seq
		e.flight = nil
		e.state = st
		e.expires = now + int64(window)
	}
	return f.waiters
}

// Forget ends f and forgets its transaction: the call was not sent, so a
// resend is a fresh try. It returns the copies that joined f, for the
// caller to answer.
func (s *Shield) Forget(f *Flight) []Waiter {
	sh := f.shard
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.owned(f); ok {
		sh.remove(f.seq, e)
		s.entries.Add(-1)
	}
	return f.waiters
}

// appendKey appends target, '|' and txid: '|' can be in neither.
func appendKey(b []byte, target string, txid []byte) []byte {
	return append(append(append(b, target...), '|'), txid...)
}

// shard is a share of the entries under one lock: an index from key to
// sequence number, and a ring of entries in the order they were claimed,
// the oldest at head. A sequence number picks its slot by its low bits, so
// the ring grows (doubling, up to limit) without renumbering.
type shard struct {
	mu    sync.Mutex
	index map[string]uint32 // key -> sequence number
	ring  []entry           // len a power of two, 0 before the first entry
	head  uint32            // sequence number of the oldest slot in use
	tail  uint32            // sequence number of the next slot
	limit uint32            // most slots in use
}

// entry is one remembered transaction. text holds its key, then (once
// settled) its four-character code and its message, in one string so that
// an entry costs one allocation; the index's key shares it.
type entry struct {
	text    string  // "" for a slot freed out of order
	flight  *Flight // the call or look-up under way; nil once settled
	expires int64   // Unix nanoseconds; ignored while in flight
	hash    Hash
	keyLen  uint8
	state   State
}

func (e *entry) code() string    { return e.text[e.keyLen : e.keyLen+4] }
func (e *entry) message() string { return e.text[e.keyLen+4:] }

func (sh *shard) at(seq uint32) *entry { return &sh.ring[seq&uint32(len(sh.ring)-1)] }

// owned returns f's entry while it is still f's: not evicted, not
// replaced.
func (sh *shard) owned(f *Flight) (*entry, bool) {
	if f.seq-sh.head >= sh.tail-sh.head {
		return nil, false
	}
	e := sh.at(f.seq)
	return e, e.flight == f
}

// insert adds key in flight and returns its sequence number. To make room
// it first drops the freed and expired slots at the head, then, at limit,
// the oldest entry (an eviction).
func (s *Shield) insert(sh *shard, key string, h Hash, now int64) uint32 {
	for sh.tail != sh.head {
		e := sh.at(sh.head)
		switch {
		case e.text == "":
		case e.flight == nil && e.expires <= now:
			sh.remove(sh.head, e)
			s.entries.Add(-1)
		case sh.tail-sh.head >= sh.limit:
			sh.remove(sh.head, e)
			s.entries.Add(-1)
			s.evictions.Add(1)
		default:
			goto room
		}
		sh.head++
	}
room:
	if int(sh.tail-sh.head) == len(sh.ring) {
		sh.grow()
	}
	seq := sh.tail
	sh.tail++
	*sh.at(seq) = entry{text: key, hash: h, keyLen: uint8(len(key)), state: InFlight}
	sh.index[key] = seq
	s.entries.Add(1)
	return seq
}

// remove frees seq's slot and its index entry. The slot stays in the ring
// until it reaches the head.
func (sh *shard) remove(seq uint32, e *entry) {
	if cur, ok := sh.index[e.text[:e.keyLen]]; ok && cur == seq {
		delete(sh.index, e.text[:e.keyLen])
	}
	*e = entry{}
}

// grow doubles the ring, up to the first power of two at or above limit.
func (sh *shard) grow() {
	n := max(len(sh.ring)*2, 16)
	ring := make([]entry, n)
	for seq := sh.head; seq != sh.tail; seq++ {
		ring[seq&uint32(n-1)] = *sh.at(seq)
	}
	sh.ring = ring
}
