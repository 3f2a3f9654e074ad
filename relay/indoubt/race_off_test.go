//go:build !race

package indoubt

// raceEnabled reports that the tests run under the race detector.
const raceEnabled = false
