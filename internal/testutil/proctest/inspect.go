package proctest

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
)

// Pid returns the operating system's id of the started binary itself (not
// of a go run wrapper: Start runs the built binary directly), for tests
// that look at it through /proc.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// OpenFDs returns how many file descriptors the process holds open, counted
// from the entries of /proc/PID/fd. Leak tests compare it with a baseline
// taken while the process was idle. It needs Linux's /proc; elsewhere, and
// once the process has exited, it returns an error.
func (p *Process) OpenFDs() (int, error) {
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(p.Pid()) + "/fd")
	if err != nil {
		return 0, fmt.Errorf("%s: open file descriptors: %w", p.name, err)
	}
	return len(entries), nil
}

// CtlErr is Ctl returning the error instead of failing the test, for use
// off the test goroutine, such as from a goroutine that keeps changing a
// fixture's mode while load runs.
func (f *Fixture) CtlErr(body string) error {
	status, answer, err := post(f.URL+"/_ctl", "application/x-www-form-urlencoded", nil, body)
	if err != nil {
		return fmt.Errorf("fixture control %s: %w", body, err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("fixture control %s: HTTP %d: %s", body, status, answer)
	}
	return nil
}
