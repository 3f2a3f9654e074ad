package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// process is one redis-server (or sentinel) run of a Server or a node:
// started, waited on until it answers PING, signalled and reaped. It is
// safe for concurrent use.
type process struct {
	mu  sync.Mutex
	cmd *exec.Cmd     // guarded by mu; nil while stopped
	out *output       // guarded by mu; the running (or last) run's output
	end chan struct{} // guarded by mu; closed when cmd has been reaped
}

// run starts bin with args and waits until addr answers PING. A run that
// exits first, or does not answer within StartTimeout (it is killed then),
// is an error that holds what it printed.
func (p *process) run(addr, bin string, args ...string) error {
	cmd := exec.Command(bin, args...)
	out := &output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	end := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(end)
	}()
	p.mu.Lock()
	p.cmd, p.out, p.end = cmd, out, end
	p.mu.Unlock()

	deadline := time.Now().Add(StartTimeout)
	for {
		if err := ping(addr); err == nil {
			return nil
		}
		select {
		case <-end:
			p.mu.Lock()
			p.cmd = nil
			p.mu.Unlock()
			return fmt.Errorf("exited before answering PING on %s:\n%s", addr, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = p.signal(syscall.SIGKILL, 0)
			return fmt.Errorf("no answer to PING on %s within %v:\n%s", addr, StartTimeout, out.String())
		}
	}
}

// pid returns the running process's id, or 0 while it is stopped.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// output returns what the running (or last) run printed.
func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.out == nil {
		return ""
	}
	return p.out.String()
}

// signal sends sig to the running process and waits until it is reaped;
// after grace (when above zero) it kills it. A stopped process is left
// alone. The error is the signal's, for the caller's test to report.
func (p *process) signal(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	cmd, end := p.cmd, p.end
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	err := cmd.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	if grace > 0 {
		select {
		case <-end:
			return err
		case <-time.After(grace):
			_ = cmd.Process.Kill()
		}
	}
	<-end
	return err
}

// output is what one redis-server process printed, safe for concurrent
// writes and reads.
type output struct {
	mu sync.Mutex
	b  []byte
}

func (b *output) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	return len(p), nil
}

func (b *output) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}
