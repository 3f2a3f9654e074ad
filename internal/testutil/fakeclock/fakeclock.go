// Package fakeclock provides a manually advanced clock for tests of
// time-driven code, so no test has to sleep for a timeout to pass.
//
// Typical use:
//
//	clk := fakeclock.New(time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC))
//	b := breaker.New(breaker.Settings{Clock: clk, ResetTimeout: 10 * time.Second})
//	clk.Advance(10 * time.Second)
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told to. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time // guarded by mu
}

// New returns a Clock that reads start until it is advanced.
func New(start time.Time) *Clock {
	return &Clock{now: start}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
