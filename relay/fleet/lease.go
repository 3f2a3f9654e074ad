package fleet

import (
	"context"
	"time"

	"github.com/relayhub/relayhub/breaker"
)

// renewLease renews, every third of the lease, the probe lease this hub
// holds while its breaker is half-open, and returns when to renew it next.
func (f *Fleet) renewLease(ctx context.Context, t *target, now time.Time) time.Time {
	if t.renewAt.IsZero() {
		// The probe's start renewed it.
		t.renewAt = now.Add(t.lease / 3)
	}
	if now.Before(t.renewAt) {
		return t.renewAt
	}
	st, err := f.runScript(ctx, scriptLease, t, 0, msText(t.lease))
	if err != nil {
		f.failed(t)
		f.report(err)
		return time.Time{}
	}
	if st.code < 0 {
		t.readAgain = true
		return now
	}
	t.renewAt = now.Add(t.lease / 3)
	return t.renewAt
}

// permit gives the breaker its probe permit once its open period has ended:
// through the probe lease while the store answers for the target, at once
// while it does not (the store, or the target's shard of it, is down).
// A hub whose breaker is half-open on the lease it won keeps the lease for
// as long as it stays so: a breaker that needs several healthy probes
// (breaker.Policy.ProbeSuccesses) stays half-open between them, and no
// other hub may probe meanwhile. It returns when to look again (zero: no
// need).
func (f *Fleet) permit(ctx context.Context, t *target, now time.Time) time.Time {
	snap := t.b.Snapshot()
	if snap.State == breaker.HalfOpen && t.permitted == t.known && !t.down {
		return f.renewLease(ctx, t, now)
	}
	if snap.State != breaker.Open || snap.Held {
		return time.Time{}
	}
	if snap.RetryAfter > 0 {
		return now.Add(snap.RetryAfter)
	}
	if t.down {
		t.b.PermitProbe()
		return time.Time{}
	}
	if t.permitted == t.known {
		if now.Before(t.permitEnd) {
			return t.permitEnd
		}
		if !t.b.WithdrawPermit() {
			// The probe is out, and its start renewed the lease.
			return time.Time{}
		}
		// No request came to use the permit: it is taken back before
		// the lease lapses, so the hub that wins it next is the only
		// one that may probe. This hub asks again only after the others
		// had their turn at the lapsed lease.
		t.permitted = -1
		t.unsetLease()
		t.leaseAt = now.Add(t.lease / 5)
		f.log.Info().Str("target", t.name).Int64("epoch", t.known).Msg("probe lease unused: permit taken back")
		return t.leaseAt
	}
	if now.Before(t.leaseAt) {
		return t.leaseAt
	}
	t.renewAt = time.Time{}
	st, err := f.runScript(ctx, scriptLease, t, 0, msText(t.lease))
	if err != nil {
		f.failed(t)
		f.report(err)
		t.b.PermitProbe()
		return time.Time{}
	}
	switch st.code {
	case 1:
		t.permitted = t.known
		// A tenth of the lease, at least 50 ms, is kept for taking the
		// permit back before another hub can win the lease.
		t.permitEnd = now.Add(t.lease - max(t.lease/10, 50*time.Millisecond))
		t.setLease()
		t.b.PermitProbe()
		f.log.Info().Str("target", t.name).Int64("epoch", t.known).Msg("probe lease won: this hub sends the fleet's probe")
		return time.Time{}
	case 0:
		t.leaseAt = now.Add(min(max(st.wait, 5*time.Millisecond), t.lease))
		return t.leaseAt
	default:
		t.readAgain = true
		return now
	}
}
