package dedup

import (
	"context"
	"time"
)

// Record is a transaction as a Store keeps it. A plain value.
type Record struct {
	// State is InFlight, Answered or InDoubt.
	State State
	// Hash is the payload's.
	Hash Hash
	// Hub names the hub that claimed or settled the transaction.
	Hub string
	// Code and Message are the answer, once Answered or InDoubt.
	Code    string
	Message string
}

// Store shares the shield among the hubs of a fleet: a hub claims a
// transaction in the store before its call and settles it there after,
// so that a resend to any hub finds it. A transaction is known by its
// target, its Scope and its TXID. Each method is bounded by the
// store's own short timeout as well as by ctx; an error means the store
// could not be used, and the hub falls back to its own memory.
// Implementations must be safe for concurrent use.
type Store interface {
	// Claim stores rec (InFlight) for target's txid, kept for ttl, unless
	// a record is there already: then it returns that record and false.
	Claim(ctx context.Context, target string, scope Scope, txid string, rec Record, ttl time.Duration) (existing Record, claimed bool, err error)
	// Settle replaces target's txid with rec, kept for ttl: Answered or
	// InDoubt once a call has ended, or InFlight when a hub takes over a
	// transaction in doubt that its target never applied.
	Settle(ctx context.Context, target string, scope Scope, txid string, rec Record, ttl time.Duration) error
	// Release deletes target's txid, when it is still the InFlight record
	// hub claimed: the call was not sent.
	Release(ctx context.Context, target string, scope Scope, txid, hub string) error
}
