package main_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests run every console block of README.md's tour against the
// real binaries, so that what the README shows is what they do, and hold
// the README's first screen to the two commands it starts with.

// readmeClient makes the HTTP requests the README makes with curl.
var readmeClient = &http.Client{Timeout: 5 * time.Second}

// firstScreen is how many lines of the README a reader sees before
// scrolling: a terminal's height.
const firstScreen = 24

// tourTimestamp is the time of a breaker-log line, which is another one on
// every run.
var tourTimestamp = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`)

// The shell forms the tour uses beyond a plain command.
var (
	// tourHeredoc is a command writing a file: cat > NAME <<'EOF'.
	tourHeredoc = regexp.MustCompile(`^cat > (\S+) <<'EOF'$`)
	// tourLoop is a loop over words: for VAR in WORDS; do COMMAND; done.
	tourLoop = regexp.MustCompile(`^for ([A-Za-z_][A-Za-z0-9_]*) in ([^;]+); do (.+); done$`)
	// tourDefaultAddr is one of make run's default addresses, which a
	// command must not reach once the test's are in its place.
	tourDefaultAddr = regexp.MustCompile(`(127\.0\.0\.1|localhost)[:/]92\d\d\b`)
)

// tourStep is one command of a README console block and the lines it
// prints.
type tourStep struct {
	line    int      // the command's line in README.md
	command string   // without the "$ " and any trailing comment
	output  []string // the lines after it up to the next command, without trailing blank lines
}

// tourFile is a file the tour writes with a heredoc.
type tourFile struct {
	name string
	body string // as the README shows it
}

// tourRun is the part of the tour one make run serves: the files written
// before it starts, the environment it is started with, and the commands
// run against it, up to the next make run.
type tourRun struct {
	line  int // the line of its make run in README.md; 0 for the one the tour starts with
	files []tourFile
	env   []string // KEY=VALUE, as written before make run
	steps []tourStep
}

// readmeLines returns the lines of README.md.
func readmeLines(t *testing.T) []string {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(moduleRoot(t), "README.md"))
	require.NoError(t, err)
	return strings.Split(string(body), "\n")
}

// readTour reads every console block of README.md's section "A 60-second
// tour", in order, into the make runs they are run against. The first is
// the make run the tour starts with; a command [KEY=VALUE ...] make run
// starts the next, with the files the heredocs before it wrote.
func readTour(t *testing.T) []tourRun {
	t.Helper()
	lines := readmeLines(t)
	start := indexOf(lines, 0, "## A 60-second tour")
	require.GreaterOrEqual(t, start, 0, "README.md has no section \"A 60-second tour\"")
	end := len(lines)
	for i := start + 1; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "## ") {
			end = i
			break
		}
	}
	first := indexOf(lines[:end], start, "```console")
	require.Greater(t, first, start, "the tour has no console block")
	require.Contains(t, strings.Join(lines[start:first], "\n"), "`make run` going",
		"the tour's first block runs against make run: the text before it must say so")

	runs := []tourRun{{}}
	var files []tourFile
	for i := first; i < end; i++ {
		if lines[i] != "```console" {
			continue
		}
		for i++; i < end && lines[i] != "```"; i++ {
			l := lines[i]
			run := &runs[len(runs)-1]
			cmd, isCmd := strings.CutPrefix(l, "$ ")
			if !isCmd {
				require.NotEmpty(t, run.steps, "README.md:%d: output %q before any command", i+1, l)
				step := &run.steps[len(run.steps)-1]
				step.output = append(step.output, l)
				continue
			}
			cmd = withoutComment(cmd)
			if m := tourHeredoc.FindStringSubmatch(cmd); m != nil {
				eof := indexOf(lines[:end], i+1, "EOF")
				require.Greater(t, eof, i, "README.md:%d: the heredoc of %s does not end", i+1, m[1])
				files = append(files, tourFile{name: m[1], body: strings.Join(lines[i+1:eof], "\n") + "\n"})
				i = eof
				continue
			}
			if words := strings.Fields(cmd); len(words) >= 2 && words[len(words)-2] == "make" && words[len(words)-1] == "run" {
				runs = append(runs, tourRun{line: i + 1, files: files, env: words[:len(words)-2]})
				files = nil
				continue
			}
			run.steps = append(run.steps, tourStep{line: i + 1, command: cmd})
		}
		require.Less(t, i, end, "README.md:%d: the console block does not end", first+1)
	}
	require.Empty(t, files, "files written after the tour's last make run are never read")
	for r := range runs {
		require.NotEmpty(t, runs[r].steps, "README.md:%d: no command runs against this make run", runs[r].line)
		for s := range runs[r].steps {
			out := runs[r].steps[s].output
			for len(out) > 0 && out[len(out)-1] == "" {
				out = out[:len(out)-1]
			}
			runs[r].steps[s].output = out
		}
	}
	return runs
}

// tourRuns is readTour held to the two make runs the tour tests run
// against, so that no console block of the tour goes unchecked.
func tourRuns(t *testing.T) []tourRun {
	t.Helper()
	runs := readTour(t)
	require.Len(t, runs, 2, "the tour starts make run once and again with the shield: "+
		"TestReadmeTourTripsAndRecovers runs against the first, TestReadmeTourResendIsResolved the second")
	return runs
}

// indexOf returns the index of the first of lines from from on that is
// want, or -1.
func indexOf(lines []string, from int, want string) int {
	for i := from; i < len(lines); i++ {
		if lines[i] == want {
			return i
		}
	}
	return -1
}

// withoutComment returns cmd without a trailing "# ..." comment outside
// quotes, and the spaces before it.
func withoutComment(cmd string) string {
	quoted := false
	for i, r := range cmd {
		switch {
		case r == '\'':
			quoted = !quoted
		case r == '#' && !quoted && i > 0 && cmd[i-1] == ' ':
			return strings.TrimRight(cmd[:i], " ")
		}
	}
	return cmd
}

// shellWords splits cmd as a shell would, for the commands the README
// uses: words apart at spaces, single quotes kept together.
func shellWords(t *testing.T, cmd string) []string {
	t.Helper()
	var (
		words  []string
		word   strings.Builder
		inWord bool
		quoted bool
	)
	for _, r := range cmd {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	require.False(t, quoted, "unbalanced quote in %q", cmd)
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// expand returns cmd with $name and ${name} outside single quotes replaced
// by value, as the shell expands a loop's variable.
func expand(cmd, name, value string) string {
	var b strings.Builder
	quoted := false
	for i := 0; i < len(cmd); i++ {
		c := cmd[i]
		if c == '\'' {
			quoted = !quoted
		}
		if c == '$' && !quoted {
			rest := cmd[i+1:]
			if strings.HasPrefix(rest, "{"+name+"}") {
				b.WriteString(value)
				i += len(name) + 2
				continue
			}
			if strings.HasPrefix(rest, name) && (len(rest) == len(name) || !isNameByte(rest[len(name)])) {
				b.WriteString(value)
				i += len(name)
				continue
			}
		}
		b.WriteByte(c)
	}
	return b.String()
}

// isNameByte reports whether c may be part of a shell variable's name.
func isNameByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// outputPattern returns the pattern that what a command prints must match
// to be what the README shows as want: line by line as written, except
// that a line "..." stands for one or more lines, and a breaker-log time
// for any such time.
func outputPattern(want []string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`\A`)
	for _, l := range want {
		if l == "..." {
			b.WriteString(`(?:.*\n)+`)
			continue
		}
		last := 0
		for _, m := range tourTimestamp.FindAllStringIndex(l, -1) {
			b.WriteString(regexp.QuoteMeta(l[last:m[0]]))
			b.WriteString(tourTimestamp.String())
			last = m[1]
		}
		b.WriteString(regexp.QuoteMeta(l[last:]))
		b.WriteString(`\n`)
	}
	b.WriteString(`\z`)
	return regexp.MustCompile(b.String())
}

// tourTerminal is the reader's second terminal while one make run is
// going: the directory it is in (the repository's, where make run keeps
// breaker.log), the fixtures and the hub make run started, and the
// addresses of theirs that stand in for make run's defaults.
type tourTerminal struct {
	t     *testing.T
	dir   string
	core  *proctest.Fixture
	claim *proctest.Fixture
	hub   *proctest.Process
	addrs *strings.Replacer
}

// startTour does what make run does, on free ports: it starts a CORE and
// a CLAIM fixture and the relay as scripts/run.sh does, the relay with the
// script's RELAY_TARGET, its breaker log dir/breaker.log and run's
// environment, after writing run's files into dir with the fixtures'
// addresses for 127.0.0.1:9201 and 127.0.0.1:9202.
func startTour(t *testing.T, dir string, run tourRun) *tourTerminal {
	t.Helper()
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	fixtures := []string{
		"127.0.0.1:9201", hostPort(core), "localhost:9201", hostPort(core),
		"127.0.0.1:9202", hostPort(claim), "localhost:9202", hostPort(claim),
	}
	for _, f := range run.files {
		body := strings.NewReplacer(fixtures...).Replace(f.body)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f.name), []byte(body), 0o600))
	}
	env := []string{
		"RELAY_TARGET=CORE=" + core.URL + ",CLAIM=" + claim.URL,
		"RELAY_LISTEN=127.0.0.1:0",
		"RELAY_ADMIN_LISTEN=127.0.0.1:0",
		"RELAY_BREAKER_LOG=" + filepath.Join(dir, "breaker.log"),
	}
	for _, kv := range run.env {
		key, value, ok := strings.Cut(kv, "=")
		require.True(t, ok && strings.HasPrefix(key, "RELAY_"), "README.md:%d: make run's environment: %q is no RELAY_ variable", run.line, kv)
		if key == "RELAY_CONFIG" && !filepath.IsAbs(value) {
			kv = key + "=" + filepath.Join(dir, value)
		}
		env = append(env, kv) // after the defaults above, so it wins over them
	}
	hub := proctest.StartEnv(t, relayPkg, env)
	host, port, err := net.SplitHostPort(hub.Addr())
	require.NoError(t, err)
	return &tourTerminal{
		t: t, dir: dir, core: core, claim: claim, hub: hub,
		addrs: strings.NewReplacer(append(fixtures,
			"127.0.0.1:9200", hub.Addr(), "localhost:9200", hub.Addr(),
			"/dev/tcp/127.0.0.1/9200", "/dev/tcp/"+host+"/"+port)...),
	}
}

// adminAddr is the hub's admin address, from its start-up line.
func (term *tourTerminal) adminAddr(t *testing.T) string {
	t.Helper()
	for _, l := range term.hub.LogLines() {
		if a, ok := l["admin_addr"].(string); ok && a != "" {
			return a
		}
	}
	t.Fatalf("no admin_addr in the relay's log:\n%s", term.hub.Stderr())
	return ""
}

// runAll runs each step in turn and checks that it prints what the README
// shows.
func (term *tourTerminal) runAll(steps []tourStep) {
	term.t.Helper()
	for _, step := range steps {
		got := term.run(step.command)
		assert.Regexp(term.t, outputPattern(step.output), got,
			"README.md:%d: $ %s\nshows:\n%s", step.line, step.command, strings.Join(step.output, "\n"))
	}
}

// run runs cmd as the README's terminal would, with this make run's
// addresses for the defaults, and returns what it prints, standard output
// then standard error.
func (term *tourTerminal) run(cmd string) string {
	t := term.t
	t.Helper()
	cmd = term.addrs.Replace(cmd)
	require.NotRegexp(t, tourDefaultAddr, cmd, "README command %q: an address the test has not started", cmd)
	if m := tourLoop.FindStringSubmatch(cmd); m != nil {
		var out strings.Builder
		for _, w := range strings.Fields(m[2]) {
			out.WriteString(term.run(expand(m[3], m[1], w)))
		}
		return out.String()
	}
	if strings.Contains(cmd, "/dev/tcp/") {
		return term.bash(cmd)
	}
	words := shellWords(t, cmd)
	switch words[0] {
	case "curl":
		return term.curl(words[1:])
	case "bin/relayctl":
		require.Contains(t, []string{"send", "in-doubt"}, words[1], "only relayctl send and in-doubt are run: %q", cmd)
		args := append([]string{"send", "--addr", term.hub.Addr()}, words[2:]...)
		if words[1] == "in-doubt" {
			args = append([]string{"in-doubt", "--admin", term.adminAddr(t)}, words[2:]...)
		}
		res := proctest.Run(t, "./cmd/relayctl", args...)
		return res.Stdout + res.Stderr
	case "cat":
		require.Len(t, words, 2, "cat of one file: %q", cmd)
		body, err := os.ReadFile(filepath.Join(term.dir, words[1]))
		require.NoError(t, err)
		return string(body)
	case "sleep":
		require.Len(t, words, 2, "sleep SECONDS: %q", cmd)
		secs, err := strconv.ParseFloat(words[1], 64)
		require.NoError(t, err, cmd)
		time.Sleep(time.Duration(secs * float64(time.Second)))
		return ""
	}
	t.Fatalf("README command %q: no way to run it here", cmd)
	return ""
}

// bash runs cmd in bash itself, for what only bash does (its /dev/tcp),
// in the terminal's directory, and returns what it prints.
func (term *tourTerminal) bash(cmd string) string {
	t := term.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), proctest.WaitTimeout)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Dir = term.dir
	c.Env = proctest.Environ()
	out, err := c.CombinedOutput()
	require.NoError(t, err, "bash -c %q: %s", cmd, out)
	return string(out)
}

// curl makes the request of curl's args (-s, -XMETHOD, -d BODY and a URL
// of one of the fixtures, without a scheme as the README writes it) and
// returns the body.
func (term *tourTerminal) curl(args []string) string {
	t := term.t
	t.Helper()
	method, target, body := http.MethodGet, "", ""
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-s":
		case strings.HasPrefix(a, "-X"):
			method = strings.TrimPrefix(a, "-X")
		case a == "-d":
			i++
			require.Less(t, i, len(args), "curl -d without a body")
			body = args[i]
		default:
			if !strings.Contains(a, "://") {
				a = "http://" + a
			}
			u, err := url.Parse(a)
			require.NoError(t, err)
			require.Contains(t, []string{hostPort(term.core), hostPort(term.claim)}, u.Host, "curl of %q: only the fixtures are asked", args[i])
			target = a
		}
	}
	require.NotEmpty(t, target, "curl without a URL")
	if body != "" && method == http.MethodGet {
		method = http.MethodPost // as curl -d does
	}
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends it
	}
	resp, err := readmeClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(got)
}

func TestReadmeOutputPattern(t *testing.T) {
	tests := []struct {
		name  string
		shown []string
		got   string
		match bool
	}{
		{name: "nothing shown, nothing printed", got: "", match: true},
		{name: "the same lines", shown: []string{"T1|0000|balance=100000"}, got: "T1|0000|balance=100000\n", match: true},
		{name: "another line", shown: []string{"T1|0000|balance=100000"}, got: "T1|0000|balance=99500\n", match: false},
		{name: "a line more", shown: []string{"a"}, got: "a\nb\n", match: false},
		{name: "the last newline missing", shown: []string{"a"}, got: "a", match: false},
		{name: "... for lines", shown: []string{"F1", "...", "F5"}, got: "F1\nF2\nF3\nF4\nF5\n", match: true},
		{name: "... for one line", shown: []string{"F1", "...", "F5"}, got: "F1\nF3\nF5\n", match: true},
		{name: "... for no line", shown: []string{"F1", "...", "F5"}, got: "F1\nF5\n", match: false},
		{name: "... keeps the lines around it", shown: []string{"F1", "...", "F5"}, got: "F1\nF2\nF6\n", match: false},
		{
			name:  "another breaker-log time",
			shown: []string{"2026-12-01T15:49:04.102Z|CORE|CLOSED->OPEN"},
			got:   "2031-01-02T03:04:05.006Z|CORE|CLOSED->OPEN\n", match: true,
		},
		{
			name:  "a time not of a breaker log",
			shown: []string{"2026-12-01T15:49:04.102Z|CORE|CLOSED->OPEN"},
			got:   "2031-01-02T03:04:05Z|CORE|CLOSED->OPEN\n", match: false,
		},
		{
			name:  "another change at the time",
			shown: []string{"2026-12-01T15:49:04.102Z|CORE|CLOSED->OPEN"},
			got:   "2026-12-01T15:49:04.102Z|CORE|OPEN->HALF_OPEN\n", match: false,
		},
		{name: "regexp characters are plain", shown: []string{"a.b"}, got: "axb\n", match: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.match, outputPattern(tt.shown).MatchString(tt.got))
		})
	}
}

func TestReadmeFirstScreenShowsMakeRunAndMakeTest(t *testing.T) {
	// Given the README's first code block, before its first section,
	lines := readmeLines(t)
	open := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "## ") {
			break
		}
		if strings.HasPrefix(l, "```") {
			open = i
			break
		}
	}
	require.GreaterOrEqual(t, open, 0, "README.md has no code block before its first section")
	end := indexOf(lines, open+1, "```")
	require.Greater(t, end, open, "README.md:%d: the code block does not end", open+1)

	// then it is on the first screen, and its commands are make run and
	// make test.
	assert.Less(t, end, firstScreen, "README.md:%d: the block of make run and make test ends below the first screen", end+1)
	var cmds []string
	for _, l := range lines[open+1 : end] {
		if cmd := withoutComment(l); cmd != "" {
			cmds = append(cmds, cmd)
		}
	}
	assert.Equal(t, []string{"make run", "make test"}, cmds)
}

func TestReadmeTourTripsAndRecovers(t *testing.T) {
	// Given make run going, on free ports,
	run := tourRuns(t)[0]
	term := startTour(t, t.TempDir(), run)

	// when each command of the tour up to the restart runs in turn (a
	// business rejection, CORE failing until its breaker opens, CLAIM
	// untouched, the reset timeout, the probe, bash's /dev/tcp),
	// then each prints what the README shows.
	term.runAll(run.steps)
}

func TestReadmeTourResendIsResolved(t *testing.T) {
	// Given make run started again with the tour's settings file and
	// environment, the fixture's address in place of 127.0.0.1:9201,
	run := tourRuns(t)[1]
	term := startTour(t, t.TempDir(), run)

	// when each command of the console blocks that follow runs in turn,
	// then each prints what the README shows: the hub settles the
	// withdrawal in doubt on its own, a resend is answered with CORE's own
	// answer, and CORE got the withdrawal once.
	term.runAll(run.steps)
}
