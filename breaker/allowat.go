package breaker

import "time"

// AllowAt is Allow at now, a reading of the breaker's clock that the
// caller took, so that one reading serves many calls: a hub's connection
// takes one for a batch of pipelined requests rather than one for every
// refusal (6 % of a refused line's instructions, and on a virtual
// machine's clock more in time; BenchmarkOpenRefuseAt).
//
// It decides exactly as Allow would at now, and a change it makes (an
// open breaker's probe) is stamped with now. A reading a little old only
// makes every period look a little less passed: a refusal lasts a little
// longer, a probe waits for a later reading, and since an open period
// must have passed at now for a change, the change is never stamped
// before the one that began that period. now must not come from another
// clock, nor be later than the clock's time. A closed breaker admits
// without looking at now.
func (b *Breaker) AllowAt(now time.Time) (t Ticket, retryAfter time.Duration, err error) {
	w := b.word.Load()
	if stateOf(w) == Closed {
		return Ticket{generation: generationOf(w)}, 0, nil
	}
	return b.allowOpen(w, now)
}
