//go:build race

package proctest

// raceEnabled reports whether the running test binary was built with -race,
// so the binaries it builds are race-checked too.
const raceEnabled = true
