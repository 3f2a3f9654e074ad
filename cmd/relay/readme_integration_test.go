package main_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests run lines of README.md against the real binaries, so that
// what the README shows is what they do.

// readmeClient makes the HTTP requests the README makes with curl.
var readmeClient = &http.Client{Timeout: 5 * time.Second}

// tourStep is one command of a README console block and the lines it
// prints.
type tourStep struct {
	command string // without the "$ " and any trailing comment
	output  string // the lines after it, up to the next command
}

// resendTour is the part of the README's tour that settles a resend: the
// settings file it writes, the environment it starts make run with, and
// the console block that follows.
type resendTour struct {
	settings string
	env      []string // KEY=VALUE, as written before make run
	steps    []tourStep
}

// readResendTour reads the resend part of the README's tour: the block
// that writes shield.toml and starts make run, then the next console
// block.
func readResendTour(t *testing.T) resendTour {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(moduleRoot(t), "README.md"))
	require.NoError(t, err)
	lines := strings.Split(string(body), "\n")
	var tour resendTour
	i := indexOf(lines, 0, "$ cat > shield.toml <<'EOF'")
	require.GreaterOrEqual(t, i, 0, "README.md has no tour step writing shield.toml")
	end := indexOf(lines, i+1, "EOF")
	require.Greater(t, end, i, "the heredoc of shield.toml does not end")
	tour.settings = strings.Join(lines[i+1:end], "\n") + "\n"
	run := lines[end+1]
	require.True(t, strings.HasPrefix(run, "$ ") && strings.HasSuffix(run, " make run"), "after shield.toml, want the line starting make run, got %q", run)
	tour.env = strings.Fields(strings.TrimSuffix(strings.TrimPrefix(run, "$ "), " make run"))

	start := indexOf(lines, end, "```console")
	require.Greater(t, start, end, "no console block after make run")
	for _, l := range lines[start+1:] {
		if l == "```" {
			break
		}
		if cmd, ok := strings.CutPrefix(l, "$ "); ok {
			tour.steps = append(tour.steps, tourStep{command: withoutComment(cmd)})
			continue
		}
		require.NotEmpty(t, tour.steps, "output %q before any command", l)
		tour.steps[len(tour.steps)-1].output += l + "\n"
	}
	require.NotEmpty(t, tour.steps, "the console block has no command")
	return tour
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

// runTourStep runs cmd as the README's terminal would, with the fixture's
// address for localhost:9201 and the hub's for relayctl, and returns what
// it prints.
func runTourStep(t *testing.T, cmd string, core *proctest.Fixture, hubAddr string) string {
	t.Helper()
	words := shellWords(t, cmd)
	switch words[0] {
	case "curl":
		return curl(t, words[1:], strings.TrimPrefix(core.URL, "http://"))
	case "bin/relayctl":
		require.Equal(t, "send", words[1], "only relayctl send is run: %q", cmd)
		args := append([]string{"send", "--addr", hubAddr}, words[2:]...)
		res := proctest.Run(t, "./cmd/relayctl", args...)
		require.Equal(t, 0, res.ExitCode, "%s: stderr %s", cmd, res.Stderr)
		return res.Stdout
	}
	t.Fatalf("README command %q: no way to run it here", cmd)
	return ""
}

// curl makes the request of curl's args (-s, -XMETHOD, -d BODY and a URL
// on localhost:9201, which becomes coreAddr) and returns the body.
func curl(t *testing.T, args []string, coreAddr string) string {
	t.Helper()
	method, url, body := http.MethodGet, "", ""
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
			rest, ok := strings.CutPrefix(a, "localhost:9201")
			require.True(t, ok, "curl of %q: only CORE's fixture is asked", a)
			url = "http://" + coreAddr + rest
		}
	}
	require.NotEmpty(t, url, "curl without a URL")
	req, err := http.NewRequest(method, url, strings.NewReader(body))
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

func TestReadmeTourResendIsResolved(t *testing.T) {
	// Given the tour's settings file and environment, with the fixture's
	// address in place of 127.0.0.1:9201,
	tour := readResendTour(t)
	core := proctest.StartFixture(t, "CORE", "core")
	coreAddr := strings.TrimPrefix(core.URL, "http://")
	conf := writeFile(t, "shield.toml", strings.ReplaceAll(tour.settings, "127.0.0.1:9201", coreAddr))
	var env []string
	for _, kv := range tour.env {
		key, _, ok := strings.Cut(kv, "=")
		require.True(t, ok && strings.HasPrefix(key, "RELAY_"), "make run's environment: %q is no RELAY_ variable", kv)
		if key == "RELAY_CONFIG" {
			kv = key + "=" + conf
		}
		env = append(env, kv)
	}
	hub := proctest.StartEnv(t, "./cmd/relay", env,
		"--listen", "127.0.0.1:0", "--admin-listen", "",
		"--target", "CORE="+core.URL, "--breaker-log", filepath.Join(t.TempDir(), "breaker.log"))

	// when each command of the console block runs in turn,
	// then each prints what the README shows.
	for _, step := range tour.steps {
		got := runTourStep(t, step.command, core, hub.Addr())
		assert.Equal(t, step.output, got, "README: $ %s", step.command)
	}
}
