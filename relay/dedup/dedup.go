// Package dedup is the duplicate-TXID shield: for each target, scope and TXID it
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
	// Full: nothing was remembered, and the Shield is at MaxEntries with
	// transactions in flight or in doubt only, which it never forgets
	// before their window: the TXID is not claimed, and no call is to be
	// made.
	Full
)

// Waiter is a copy of a request that joined a flight: the flight's leader
// hands it the answer.
type Waiter interface {
	Answer(code string, msg []byte)
}

// Scope says whose TXIDs a transaction is among: the zero Scope holds a
// target's TXIDs for all its clients together, ClientScope one client's
// own. A plain value.
type Scope struct {
	id     Hash
	client bool
}

// ClientScope returns the Scope of the client known by identity. It keeps
// the first 16 bytes of the identity's SHA-256, so that keys stay short
// and a store never holds the identity itself.
func ClientScope(identity string) Scope {
	sum := sha256.Sum256([]byte(identity))
	return Scope{id: Hash(sum[:16]), client: true}
}

// Client reports whether sc is a client's own, and then the hash of its
// identity.
func (sc Scope) Client() (Hash, bool) { return sc.id, sc.client }

// Config configures a Shield. The zero value is usable.
type Config struct {
	// MaxEntries bounds the transactions remembered. Past it the answered
	// one settled longest ago is forgotten first, and counted
	// (Evictions); one in flight or in doubt never is, and while nothing
	// else is left a new TXID is refused (Full, counted in Refusals).
	// Zero means DefaultMaxEntries.
	MaxEntries int
	// Now is the clock of the windows. Nil means time.Now.
	Now func() time.Time
}

// shardCount spreads the entries over locks: a request locks one shard.
const shardCount = 64

// Shield remembers transactions by target, scope and TXID. It is safe for
// concurrent use.
type Shield struct {
	now       func() time.Time
	limit     int64     // Config.MaxEntries
	base      time.Time // when New ran: Shield.second counts from it
	seed      maphash.Seed
	evictions atomic.Int64
	refusals  atomic.Int64
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
		sh := &s.shards[i]
		sh.n = uint8(i)
		sh.index = make(map[uint64]uint32)
		sh.flights = make(map[uint32]*Flight)
		sh.slots = make([]entry, 1) // slot 0 is the lists' end
	}
	return s
}

// Evictions returns how many answered transactions were forgotten before
// their window ended, to keep within MaxEntries.
func (s *Shield) Evictions() int64 { return s.evictions.Load() }

// Refusals returns how many new TXIDs Begin refused (Full) because the
// Shield was at MaxEntries with transactions in flight or in doubt only.
func (s *Shield) Refusals() int64 { return s.refusals.Load() }

// Len returns how many transactions are remembered, expired ones not yet
// swept included.
func (s *Shield) Len() int64 { return s.entries.Load() }

// Flight is a claimed transaction: the call or look-up its leader makes,
// and the copies waiting for its answer. Only its leader uses it.
type Flight struct {
	shard   *shard
	slot    uint32
	key     uint64 // the key's hash
	hash    Hash
	scope   Scope
	waiters []Waiter // guarded by shard.mu
}

// Hash returns the payload hash the flight was claimed with.
func (f *Flight) Hash() Hash { return f.hash }

// Scope returns the scope the flight was claimed in.
func (f *Flight) Scope() Scope { return f.scope }

// Begin looks up target's txid in scope sc, whose payload hashes to h.
// Absent or expired, it is claimed (Claimed, with its Flight), unless the
// Shield is full of transactions it may not forget (Full); in flight with
// the same payload, the Waiter join returns joins it (Joined; join is
// called under the Shield's lock, and only then); answered within its
// window, its answer comes back (Replayed, code and message); in doubt,
// the caller claims its look-up (Resolve, with its Flight and the answer
// the first call got); remembered with another payload, Conflict.
func (s *Shield) Begin(target string, sc Scope, txid []byte, h Hash, join func() Waiter) (v Verdict, f *Flight, code, msg string) {
	var keyBuf [192]byte
	key := appendKey(keyBuf[:0], target, sc, txid)
	kh := maphash.Bytes(s.seed, key)
	sh := &s.shards[kh%shardCount]
	now := s.second(s.now())

	sh.mu.Lock()
	defer sh.mu.Unlock()
	if slot, ok := sh.index[kh]; ok {
		e := &sh.slots[slot]
		switch {
		case e.key() != string(key):
			// Another key with the same 64-bit hash: the newer one takes
			// the index, and the older is forgotten early.
		case e.state != InFlight && e.expires <= now:
			s.removeLocked(sh, slot, kh)
		case e.hash != h:
			return Conflict, nil, "", ""
		case e.state == InFlight:
			fl := sh.flights[slot]
			fl.waiters = append(fl.waiters, join())
			return Joined, nil, "", ""
		case e.state == Answered:
			return Replayed, nil, e.code(), e.message()
		default: // InDoubt
			code, msg = e.code(), e.message()
			sh.moveLocked(slot, InFlight)
			f = &Flight{shard: sh, slot: slot, key: kh, hash: h, scope: sc}
			sh.flights[slot] = f
			return Resolve, f, code, msg
		}
	}
	if !s.roomLocked(sh, now) {
		s.refusals.Add(1)
		return Full, nil, "", ""
	}
	f = &Flight{shard: sh, key: kh, hash: h, scope: sc}
	f.slot = sh.insertLocked(string(key), kh, h)
	s.entries.Add(1)
	sh.flights[f.slot] = f
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
		delete(sh.flights, f.slot)
		e.text = e.key() + code + string(msg)
		e.expires = expires
		sh.moveLocked(f.slot, st)
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
	if _, ok := sh.owned(f); ok {
		s.removeLocked(sh, f.slot, f.key)
	}
	return f.waiters
}

// second returns t in whole seconds since the Shield was made: the
// windows' unit, small enough for an entry to hold in 32 bits.
func (s *Shield) second(t time.Time) uint32 {
	return uint32(max(t.Sub(s.base), 0) / time.Second)
}

// appendKey appends target, '|' and txid, then, for a client's scope, '|'
// and its identity's hash: '|' can be in neither target nor txid, so no
// two keys are the same.
func appendKey(b []byte, target string, sc Scope, txid []byte) []byte {
	b = append(append(append(b, target...), '|'), txid...)
	if sc.client {
		b = append(append(b, '|'), sc.id[:]...)
	}
	return b
}

// roomLocked makes room for one more entry in sh, whose lock the caller
// holds, and reports whether there is room. It first forgets the
// expired entries at the heads of sh's lists; then, while the Shield is
// at its limit, the answered entries settled longest ago in sh
// (evictions) or, when sh has none, in another shard. Entries in flight
// or in doubt are in lists of their own, never looked at here, so that
// the work per call stays small however many of them there are; it
// evicts more than one only to win back what concurrent calls took past
// the limit.
func (s *Shield) roomLocked(sh *shard, now uint32) bool {
	s.sweepLocked(sh, now)
	for s.entries.Load() >= s.limit {
		if sh.lists[Answered].head == end {
			return s.roomElsewhere(sh, now)
		}
		s.evictLocked(sh)
	}
	return true
}

// roomElsewhere is roomLocked's last resort: it looks for room in the
// shards other than sh, whose lock the caller holds. It only tries their
// locks, which cannot deadlock; a busy shard that holds answered entries
// counts as room, so the bound may be passed by an entry or so while
// shards are contended, and is kept again by later calls.
func (s *Shield) roomElsewhere(sh *shard, now uint32) bool {
	busy := false
	for i := 1; i < shardCount; i++ {
		o := &s.shards[(int(sh.n)+i)%shardCount]
		if !o.mu.TryLock() {
			busy = busy || o.answered.Load() > 0
			continue
		}
		s.sweepLocked(o, now)
		for s.entries.Load() >= s.limit && o.lists[Answered].head != end {
			s.evictLocked(o)
		}
		room := s.entries.Load() < s.limit
		o.mu.Unlock()
		if room {
			return true
		}
	}
	return busy
}

// sweepLocked forgets the expired entries at the heads of sh's answered
// and in-doubt lists. Each list is in the order its entries were settled;
// with one window that is the order they expire in, and with several, an
// expired entry behind one with a longer window waits for it.
func (s *Shield) sweepLocked(sh *shard, now uint32) {
	for _, st := range [...]State{Answered, InDoubt} {
		for slot := sh.lists[st].head; slot != end && sh.slots[slot].expires <= now; slot = sh.lists[st].head {
			s.removeLocked(sh, slot, maphash.String(s.seed, sh.slots[slot].key()))
		}
	}
}

// evictLocked forgets the answered entry of sh settled longest ago, and
// counts it.
func (s *Shield) evictLocked(sh *shard) {
	slot := sh.lists[Answered].head
	s.removeLocked(sh, slot, maphash.String(s.seed, sh.slots[slot].key()))
	s.evictions.Add(1)
}

// removeLocked forgets the entry at slot of sh, whose key hashes to kh.
func (s *Shield) removeLocked(sh *shard, slot uint32, kh uint64) {
	sh.remove(slot, kh)
	s.entries.Add(-1)
}

// end is the slot number that ends a list: slot 0 holds no entry.
const end = 0

// shard is a share of the entries under one lock: an index from a key's
// hash to its slot, the slots, and the flights of the entries in flight.
// Each entry is in one of three lists, by its state, linked through its
// slot numbers: in flight, answered and in doubt, each in the order its
// entries entered it (the oldest at head). Only the answered list is ever
// evicted from, and only the answered and in-doubt lists expire. Neither
// the index nor the slots hold a pointer but the entries' text, which
// keeps a million entries cheap to hold.
type shard struct {
	mu       sync.Mutex
	index    map[uint64]uint32  // guarded by mu: key hash -> slot
	flights  map[uint32]*Flight // guarded by mu: slot -> flight, while in flight
	slots    []entry            // guarded by mu: slot 0 unused, the others in use or free
	free     uint32             // guarded by mu: the first free slot, linked through next; end when none
	lists    [numStates]list    // guarded by mu: by State; Absent's is unused
	answered atomic.Int64       // the answered list's length, read by other shards without mu
	n        uint8              // the shard's index in Shield.shards
}

// numStates is how many States there are.
const numStates = InDoubt + 1

// list is a doubly linked list of slots.
type list struct {
	head, tail uint32 // end when empty
}

// entry is one remembered transaction. text holds its key, then (once
// settled) its four-character code and its message, in one string so that
// an entry costs one allocation.
type entry struct {
	text       string // "" for a free slot
	hash       Hash
	expires    uint32 // Shield.second when it is forgotten; unused in flight
	prev, next uint32 // neighbours in its list, or in the free list (next)
	keyLen     uint8
	state      State
}

func (e *entry) key() string     { return e.text[:e.keyLen] }
func (e *entry) code() string    { return e.text[e.keyLen : e.keyLen+4] }
func (e *entry) message() string { return e.text[e.keyLen+4:] }

// owned returns f's entry while it is still f's: not evicted, not
// replaced.
func (sh *shard) owned(f *Flight) (*entry, bool) {
	if sh.flights[f.slot] != f {
		return nil, false
	}
	return &sh.slots[f.slot], true
}

// insertLocked adds key, whose hash is kh, in flight and returns its slot.
func (sh *shard) insertLocked(key string, kh uint64, h Hash) uint32 {
	slot := sh.free
	if slot != end {
		sh.free = sh.slots[slot].next
	} else {
		slot = uint32(len(sh.slots))
		sh.slots = append(sh.slots, entry{})
	}
	sh.slots[slot] = entry{text: key, hash: h, keyLen: uint8(len(key)), state: InFlight}
	sh.link(slot)
	sh.index[kh] = slot
	return slot
}

// moveLocked moves the entry at slot to the tail of st's list.
func (sh *shard) moveLocked(slot uint32, st State) {
	sh.unlink(slot)
	sh.slots[slot].state = st
	sh.link(slot)
}

// remove frees slot, its index entry (kh is its key's hash) and its
// flight.
func (sh *shard) remove(slot uint32, kh uint64) {
	if cur, ok := sh.index[kh]; ok && cur == slot {
		delete(sh.index, kh)
	}
	delete(sh.flights, slot)
	sh.unlink(slot)
	sh.slots[slot] = entry{next: sh.free}
	sh.free = slot
}

// link appends slot to the tail of its state's list.
func (sh *shard) link(slot uint32) {
	e := &sh.slots[slot]
	l := &sh.lists[e.state]
	e.prev, e.next = l.tail, end
	if l.tail == end {
		l.head = slot
	} else {
		sh.slots[l.tail].next = slot
	}
	l.tail = slot
	if e.state == Answered {
		sh.answered.Add(1)
	}
}

// unlink takes slot out of its state's list.
func (sh *shard) unlink(slot uint32) {
	e := &sh.slots[slot]
	l := &sh.lists[e.state]
	if e.prev == end {
		l.head = e.next
	} else {
		sh.slots[e.prev].next = e.next
	}
	if e.next == end {
		l.tail = e.prev
	} else {
		sh.slots[e.next].prev = e.prev
	}
	e.prev, e.next = end, end
	if e.state == Answered {
		sh.answered.Add(-1)
	}
}
