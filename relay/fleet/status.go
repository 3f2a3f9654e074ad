package fleet

import "github.com/relayhub/relayhub/relay/protocol"

// Status is the fleet as one hub sees it, for status pages. It is a plain
// value.
type Status struct {
	// HubID is this hub's name in the fleet.
	HubID string
	// StoreUp reports that the hub reaches the store, shares the state
	// of every target's breaker and hears the change channel; false while
	// any decides alone (TargetStatus.Alone says which) or the channel is
	// lost.
	StoreUp bool
	// Targets are the targets, in configuration order.
	Targets []TargetStatus
}

// TargetStatus is one target's shared state as this hub knows it. It is a
// plain value.
type TargetStatus struct {
	Name string
	// Epoch is the target's epoch in the store as this hub last applied or
	// wrote it: it moves on every open and every close anywhere in the
	// fleet. 0 before any.
	Epoch int64
	// OpenedBy is the hub whose breaker opened the fleet's breaker (or
	// whose operator held it open); empty while it is closed.
	OpenedBy string
	// Source says how the last change reached this hub: SourceLocal,
	// SourceRemote, or empty before any.
	Source string
	// ProbeLease reports that this hub won the probe lease of the current
	// open period: its breaker sends the fleet's one probe.
	ProbeLease bool
	// Alone reports that the target's breaker decides alone: the store
	// does not answer for it (the whole store, or the target's shard of a
	// Redis Cluster, is down).
	Alone bool
}

// Status returns the fleet's state as this hub sees it.
func (f *Fleet) Status() Status {
	st := Status{HubID: f.hubID, StoreUp: f.up.Load(), Targets: make([]TargetStatus, len(f.targets))}
	for i, t := range f.targets {
		st.Targets[i] = t.status()
	}
	return st
}

// Target returns one target's shared state; false when the fleet does not
// share it.
func (f *Fleet) Target(name string) (TargetStatus, bool) {
	t := f.byName[protocol.CanonicalTarget(name)]
	if t == nil {
		return TargetStatus{}, false
	}
	return t.status(), true
}

// HubID returns this hub's name in the fleet.
func (f *Fleet) HubID() string { return f.hubID }

func (t *target) status() TargetStatus {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	return t.view
}

// setView records a change of the target's shared state for Status.
func (t *target) setView(epoch int64, openedBy, source string) {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	t.view.Epoch, t.view.OpenedBy, t.view.Source = epoch, openedBy, source
	t.view.ProbeLease = false
}

// setLease records that this hub won the current probe lease.
func (t *target) setLease() {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	t.view.ProbeLease = true
}

// unsetLease records that this hub gave its probe lease up unused.
func (t *target) unsetLease() {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	t.view.ProbeLease = false
}

// setAlone records whether the target's breaker decides alone.
func (t *target) setAlone(alone bool) {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	t.view.Alone = alone
}
