//go:build !race

package relay

// raceEnabled reports that the tests run under the race detector.
const raceEnabled = false
