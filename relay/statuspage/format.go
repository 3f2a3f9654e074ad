package statuspage

// The page's plain formatting of numbers, durations and times.

import (
	"fmt"
	"strconv"
	"time"
)

// shareText is "failed of calls (percent)".
func shareText(failed, calls float64) string {
	return fmt.Sprintf("%.0f of %.0f (%s)", failed, calls, percentText(failed/calls))
}

// percentText formats a share from 0 to 1 as a percentage.
func percentText(x float64) string {
	if x > 0 && x < 0.01 {
		return "<1%"
	}
	return strconv.FormatFloat(100*x, 'f', 0, 64) + "%"
}

// rateText formats a rate per second with about two significant digits.
func rateText(x float64) string {
	switch {
	case x == 0:
		return "0"
	case x < 0.1:
		return "<0.1"
	case x < 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case x < 10000:
		return strconv.FormatFloat(x, 'f', 0, 64)
	default:
		return strconv.FormatFloat(x/1000, 'f', 0, 64) + "k"
	}
}

// latencyText formats a duration in seconds; beyond marks a quantile past
// the histogram's last bound.
func latencyText(secs float64, beyond bool) string {
	if beyond {
		return "> " + durationText(secs)
	}
	return durationText(secs)
}

// durationText formats seconds as ms below a second, else s.
func durationText(secs float64) string {
	switch {
	case secs < 0.01:
		return strconv.FormatFloat(secs*1000, 'f', 2, 64) + " ms"
	case secs < 1:
		return strconv.FormatFloat(secs*1000, 'f', 0, 64) + " ms"
	default:
		return strconv.FormatFloat(secs, 'f', 1, 64) + " s"
	}
}

// agoText formats a span of time for people: "42 s", "3 min 07 s",
// "2 h 05 min", "3 d 4 h".
func agoText(d time.Duration) string {
	d = max(d, 0)
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return strconv.FormatInt(s, 10) + " s"
	case s < 3600:
		return fmt.Sprintf("%d min %02d s", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%d h %02d min", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%d d %d h", s/86400, s%86400/3600)
	}
}

// spanText formats a window of time: whole minutes as "N min", else as
// agoText does.
func spanText(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return strconv.FormatInt(int64(d/time.Minute), 10) + " min"
	}
	return agoText(d)
}

// clockText is t's time of day in UTC.
func clockText(t time.Time) string {
	return t.UTC().Format("15:04:05")
}
