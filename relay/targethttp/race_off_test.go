//go:build !race

package targethttp

// raceEnabled reports that the tests run under the race detector.
const raceEnabled = false
