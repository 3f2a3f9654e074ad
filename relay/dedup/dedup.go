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
	limit     int64     // Config.MaxEntries
	base      time.Time // when New ran: Shield.second counts from it
	seed      maphash.Seed
	evictions atomic.Int64
	entries   atomic.Int64
	shards    [shardCount]shard
}

// New returns a Shield configured by cfg.
func New(cfg Config) *Shield {
	s := &Shield{now: cfg.Now, seed: maphash.MakeSeed(), limit: int64(cfg.MaxEntries)}
	if s.now == nil {
		s.now = time.Now
	}
	if s.limit <= 0 {
		s.limit = DefaultMaxEntries
	}
	s.base = s.now()
	for i := range s.shards {
		s.shards[i].index = make(map[uint64]uint32)
		s.shards[i].flights = make(map[uint32]*Flight)
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
	key     uint64 // the key's hash
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
// claims its look-up (Resolve, with its Flight and the answer the first
// call got); remembered with another
// payload, Conflict.
func (s *Shield) Begin(target string, txid []byte, h Hash, join func() Waiter) (v Verdict, f *Flight, code, msg string) {
	var keyBuf [160]byte
	key := appendKey(keyBuf[:0], target, txid)
	kh := maphash.Bytes(s.seed, key)
	sh := &s.shards[kh%shardCount]
	now := s.second(s.now())

	sh.mu.Lock()
	defer sh.mu.Unlock()
	if seq, ok := sh.index[kh]; ok {
		e := sh.at(seq)
		switch {
		case e.key() != string(key):
			// Another key with the same 64-bit hash: the newer one takes
			// the index, and the older is forgotten early.
		case e.state != InFlight && e.expires <= now:
			sh.remove(seq, e, kh)
			s.entries.Add(-1)
		case e.hash != h:
			return Conflict, nil, "", ""
		case e.state == InFlight:
			fl := sh.flights[seq]
			fl.waiters = append(fl.waiters, join())
			return Joined, nil, "", ""
		case e.state == Answered:
			return Replayed, nil, e.code(), e.message()
		default: // InDoubt
			code, msg = e.code(), e.message()
			e.state = InFlight
			f = &Flight{shard: sh, seq: seq, key: kh, hash: h}
			sh.flights[seq] = f
			return Resolve, f, code, msg
		}
	}
	f = &Flight{shard: sh, key: kh, hash: h}
	f.seq = s.insert(sh, string(key), kh, h, now)
	sh.flights[f.seq] = f
	return Claimed, f, "", ""
}

// Settle ends f with what became of its transaction, Answered or InDoubt
// with the answer its copies get, remembered for window from now. It
// returns the copies that joined f, for the caller to answer.
func (s *Shield) Settle(f *Flight, st State, code string, msg []byte, window time.Duration) []Waiter {
	sh := f.shard
	expires := s.second(s.now().Add(window + time.Second - 1))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.owned(f); ok {
		delete(sh.flights, f.seq)
		e.text = e.key() + code + string(msg)
		e.state = st
		e.expires = expires
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
		sh.remove(f.seq, e, f.key)
		s.entries.Add(-1)
	}
	return f.waiters
}

// second returns t in whole seconds since the Shield was made: the
// windows' unit, small enough for an entry to hold in 32 bits.
func (s *Shield) second(t time.Time) uint32 {
	return uint32(max(t.Sub(s.base), 0) / time.Second)
}

// appendKey appends target, '|' and txid: '|' can be in neither.
func appendKey(b []byte, target string, txid []byte) []byte {
	return append(append(append(b, target...), '|'), txid...)
}

// shard is a share of the entries under one lock: an index from a key's
// hash to its sequence number, a ring of entries in the order they were
// claimed (the oldest at head), and the flights of those in flight. A
// sequence number picks its slot by its low bits, so the ring grows
// (doubling) without renumbering. Neither the index nor the ring holds a
// pointer but the entries' text, which keeps a million entries cheap to
// hold and to scan.
type shard struct {
	mu      sync.Mutex
	index   map[uint64]uint32  // key hash -> sequence number
	flights map[uint32]*Flight // sequence number -> flight, while in flight
	ring    []entry            // len a power of two, 0 before the first entry
	head    uint32             // sequence number of the oldest slot in use
	tail    uint32             // sequence number of the next slot
}

// entry is one remembered transaction. text holds its key, then (once
// settled) its four-character code and its message, in one string so that
// an entry costs one allocation.
type entry struct {
	text    string // "" for a slot freed out of order
	hash    Hash
	expires uint32 // Shield.second when it is forgotten; unused in flight
	keyLen  uint8
	state   State
}

func (e *entry) key() string     { return e.text[:e.keyLen] }
func (e *entry) code() string    { return e.text[e.keyLen : e.keyLen+4] }
func (e *entry) message() string { return e.text[e.keyLen+4:] }

func (sh *shard) at(seq uint32) *entry { return &sh.ring[seq&uint32(len(sh.ring)-1)] }

// owned returns f's entry while it is still f's: not evicted, not
// replaced.
func (sh *shard) owned(f *Flight) (*entry, bool) {
	if f.seq-sh.head >= sh.tail-sh.head || sh.flights[f.seq] != f {
		return nil, false
	}
	return sh.at(f.seq), true
}

// insert adds key, whose hash is kh, in flight and returns its sequence
// number. To make room it first drops the freed and expired slots at sh's
// head, then, while the Shield is at its limit, the shard's oldest entry
// (an eviction), though one in flight or in doubt is moved to the back
// instead, up to maxMoves of them: the bound holds over all shards, give
// or take an entry a shard.
func (s *Shield) insert(sh *shard, key string, kh uint64, h Hash, now uint32) uint32 {
	moved := 0
	for sh.tail != sh.head {
		e := sh.at(sh.head)
		switch {
		case e.text == "":
		case e.state != InFlight && e.expires <= now:
			sh.remove(sh.head, e, maphash.String(s.seed, e.key()))
			s.entries.Add(-1)
		case s.entries.Load() >= s.limit && e.state != Answered && moved < maxMoves:
			// Forgetting a transaction in flight or in doubt could let a
			// second call through: it goes to the back instead.
			moved++
			s.moveToTail(sh, sh.head)
		case s.entries.Load() >= s.limit:
			sh.remove(sh.head, e, maphash.String(s.seed, e.key()))
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
	sh.index[kh] = seq
	s.entries.Add(1)
	return seq
}

// maxMoves bounds the entries in flight or in doubt that one insert moves
// to the back rather than evict: past it, or in a shard that holds nothing
// else, the oldest goes whatever its state, so that the bound is firm.
const maxMoves = 8

// moveToTail moves the entry at seq to a new slot at the tail, with its
// index entry and its flight; seq's slot is left free.
func (s *Shield) moveToTail(sh *shard, seq uint32) {
	if int(sh.tail-sh.head) == len(sh.ring) {
		sh.grow()
	}
	e := sh.at(seq)
	to := sh.tail
	sh.tail++
	*sh.at(to) = *e
	sh.index[maphash.String(s.seed, e.key())] = to
	if f := sh.flights[seq]; f != nil {
		delete(sh.flights, seq)
		sh.flights[to] = f
		f.seq = to
	}
	*e = entry{}
}

// remove frees seq's slot, its index entry (kh is its key's hash) and its
// flight. The slot stays in the ring until it reaches the head.
func (sh *shard) remove(seq uint32, e *entry, kh uint64) {
	if cur, ok := sh.index[kh]; ok && cur == seq {
		delete(sh.index, kh)
	}
	delete(sh.flights, seq)
	*e = entry{}
}

// grow doubles the ring.
func (sh *shard) grow() {
	n := max(len(sh.ring)*2, 16)
	ring := make([]entry, n)
	for seq := sh.head; seq != sh.tail; seq++ {
		ring[seq&uint32(n-1)] = *sh.at(seq)
	}
	sh.ring = ring
}
