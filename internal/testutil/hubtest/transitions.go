package hubtest

import (
	"sync"

	"github.com/relayhub/relayhub/breaker"
)

// Transitions records breaker transitions as "NAME:FROM->TO", in the order
// they are observed. The zero value is ready to use; Observe is a breaker
// transition observer (relay.Config.OnTransition). It is safe for
// concurrent use.
type Transitions struct {
	mu  sync.Mutex
	got []string // guarded by mu
}

// Observe records t.
func (tr *Transitions) Observe(t breaker.Transition) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.got = append(tr.got, t.Name+":"+t.From.String()+"->"+t.To.String())
}

// List returns a copy of the transitions recorded so far.
func (tr *Transitions) List() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.got...)
}
