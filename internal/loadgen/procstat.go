package loadgen

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTicksPerSecond is the unit of the CPU times in /proc/PID/stat
// (USER_HZ). Linux fixes it at 100 on every architecture Go supports, so
// the times read here have a resolution of 10ms: runs of a few seconds
// keep the error under a percent.
const clockTicksPerSecond = 100

// processCPU returns the CPU time, user plus system, that process pid has
// used since it started, from /proc/PID/stat (Linux only).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("cpu time of pid %d: %w", pid, err)
	}
	d, err := parseStatCPU(b)
	if err != nil {
		return 0, fmt.Errorf("cpu time of pid %d: %w", pid, err)
	}
	return d, nil
}

// parseStatCPU reads utime + stime from the text of /proc/PID/stat. The
// command name, field 2, is in parentheses and may itself hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("stat: no command name")
	}
	// After ')' come the fields from 3 (state) on; utime and stime are
	// fields 14 and 15.
	fields := bytes.Fields(stat[end+1:])
	const utime, stime = 14 - 3, 15 - 3
	if len(fields) <= stime {
		return 0, errors.New("stat: too few fields")
	}
	var ticks uint64
	for _, i := range []int{utime, stime} {
		n, err := strconv.ParseUint(string(fields[i]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: field %d: %w", i+3, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicksPerSecond, nil
}

// processRSS returns the resident set size of process pid in KiB, VmRSS of
// /proc/PID/status (Linux only).
func processRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("rss of pid %d: %w", pid, err)
	}
	kib, err := parseVmRSS(b)
	if err != nil {
		return 0, fmt.Errorf("rss of pid %d: %w", pid, err)
	}
	return kib, nil
}

// parseVmRSS reads the "VmRSS:   1234 kB" line of /proc/PID/status.
func parseVmRSS(status []byte) (int64, error) {
	for line := range bytes.SplitSeq(status, []byte{'\n'}) {
		rest, ok := bytes.CutPrefix(line, []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("status: VmRSS line %q", line)
		}
		return strconv.ParseInt(string(f[0]), 10, 64)
	}
	return 0, errors.New("status: no VmRSS line (a kernel thread, or a zombie)")
}

// cpuMeter measures the CPU time of some processes over an interval. It is
// a plain value owned by one goroutine.
type cpuMeter struct {
	pids  []int
	start []time.Duration
}

// startCPUMeter reads the CPU time used so far by each process.
func startCPUMeter(pids []int) (*cpuMeter, error) {
	m := &cpuMeter{pids: pids, start: make([]time.Duration, len(pids))}
	for i, pid := range pids {
		d, err := processCPU(pid)
		if err != nil {
			return nil, err
		}
		m.start[i] = d
	}
	return m, nil
}

// ProcessCPU is the CPU time one process used during a run; a plain
// value.
type ProcessCPU struct {
	PID int
	CPU time.Duration
}

// stop returns the CPU time each process used since startCPUMeter. A
// process that has gone away meanwhile is reported with the error and no
// time.
func (m *cpuMeter) stop() ([]ProcessCPU, error) {
	out := make([]ProcessCPU, len(m.pids))
	var errs []error
	for i, pid := range m.pids {
		out[i].PID = pid
		d, err := processCPU(pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[i].CPU = d - m.start[i]
	}
	return out, errors.Join(errs...)
}

// machineBusy returns the CPU time all CPUs of the machine have spent on
// anything but idling since boot, from the first line of /proc/stat
// (Linux only). Set beside the CPU time of the processes under test, it
// shows how much of the machine something else took during a run.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("machine cpu time: %w", err)
	}
	d, err := parseMachineBusy(b)
	if err != nil {
		return 0, fmt.Errorf("machine cpu time: %w", err)
	}
	return d, nil
}

// parseMachineBusy sums the non-idle times of the "cpu" line of
// /proc/stat: user, nice, system, irq, softirq and steal. Idle and iowait
// are left out; guest time is already part of user.
func parseMachineBusy(stat []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(stat, []byte{'\n'})
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, errors.New("stat: no cpu line")
	}
	const user, nice, system, irq, softirq, steal = 1, 2, 3, 6, 7, 8
	var ticks uint64
	for _, i := range []int{user, nice, system, irq, softirq, steal} {
		n, err := strconv.ParseUint(string(f[i]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: cpu field %d: %w", i, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicksPerSecond, nil
}

// runMeters measures the CPU time of the servers, of the generator itself
// and of the whole machine over a run. It is owned by Run's goroutine.
type runMeters struct {
	servers *cpuMeter // nil without ServerPIDs
	self    *cpuMeter // nil where /proc cannot be read
	machine time.Duration
	hasMach bool
	start   time.Time
}

// meterReading is what runMeters measured; a plain value.
type meterReading struct {
	servers []ProcessCPU
	self    time.Duration
	machine time.Duration
	wall    time.Duration
}

// startMeters starts measuring. It fails when a server's CPU time cannot
// be read, since the operator asked for it; the generator's own is best
// effort.
func startMeters(pids []int) (runMeters, error) {
	var m runMeters
	if len(pids) > 0 {
		var err error
		if m.servers, err = startCPUMeter(pids); err != nil {
			return runMeters{}, err
		}
	}
	m.self, _ = startCPUMeter([]int{os.Getpid()})
	if d, err := machineBusy(); err == nil {
		m.machine, m.hasMach = d, true
	}
	m.start = time.Now()
	return m, nil
}

// stop returns the CPU time the servers, the generator and the machine
// used since start. Only a server's is an error to miss.
func (m runMeters) stop() (meterReading, error) {
	var r meterReading
	var err error
	if m.servers != nil {
		r.servers, err = m.servers.stop()
	}
	if m.self != nil {
		if s, e := m.self.stop(); e == nil {
			r.self = s[0].CPU
		}
	}
	if m.hasMach {
		if d, e := machineBusy(); e == nil {
			r.machine, r.wall = d-m.machine, time.Since(m.start)
		}
	}
	return r, err
}
