package main_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests hold the status page to docs/OPERATING.md, "The status
// page", against the real binaries: most in a real browser, Debian's
// chromium, headless, as an operator sees and clicks it.

// updateScreenshot makes TestStatusPageInABrowser play a longer outage and
// write the page's screenshots to docs/ (make screenshot).
var updateScreenshot = flag.Bool("update-screenshot", false, "write docs/status-page.png and docs/status-page-dark.png from a longer CORE outage")

// screenshotColumns is the file of the status page's column headers, one
// a line, as they were when docs/status-page.png was taken.
var screenshotColumns = filepath.Join("..", "..", "docs", "status-page-columns.txt")

// pageHeadersJS is the JavaScript expression of the status page's column
// headers, their text with its spaces collapsed.
const pageHeadersJS = `Array.from(document.querySelectorAll("thead th"), e => e.textContent.replace(/\s+/g, " ").trim())`

// pageTooWideJS is the JavaScript expression of what keeps the status
// page from fitting its window: the page scrolling sideways, a cell not
// wholly in the window, and an element that clips its content without
// a title holding all of it (the failure's message, cut to two lines,
// has one).
const pageTooWideJS = `(() => {
  const problems = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth) {
    problems.push("the page is " + root.scrollWidth + " px wide in a window of " + root.clientWidth);
  }
  for (const cell of document.querySelectorAll("tbody td, tbody th")) {
    const r = cell.getBoundingClientRect();
    if (r.width > 0 && (r.left < 0 || r.right > root.clientWidth + 0.5)) {
      problems.push((cell.id || cell.className) + " runs from " + Math.round(r.left) + " to " + Math.round(r.right) + " px");
    }
  }
  for (const el of document.querySelectorAll("main *")) {
    const cs = getComputedStyle(el);
    if (cs.overflowX === "visible" && cs.overflowY === "visible") {
      continue;
    }
    const cut = el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1;
    if (cut && el.title !== el.textContent) {
      problems.push((el.closest("[id]") || {id: "?"}).id + ": " + el.tagName.toLowerCase() + "." + el.className + " cuts its content");
    }
  }
  return problems;
})()`

// pageToken is the admin token of the relays these tests start.
const pageToken = "page-test-token"

// browserTimeout bounds each step a test asks of the browser.
const browserTimeout = 20 * time.Second

// chromiumPath returns the path of the chromium binary, failing the test
// with what to install when there is none: these tests never skip.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: the status page's browser tests need it " +
		"(apt-get install chromium, as .ci/run does)")
	return ""
}

// newBrowser starts a headless chromium with a fresh profile and nothing
// running in the background, stopped when the test ends, and returns its
// context.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	profile := t.TempDir() // removed after the browser has stopped
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(profile),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.WindowSize(1440, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	// Start the browser now, with no timeout (one would stop it), so a
	// failure to start is reported here.
	require.NoError(t, chromedp.Do(browser), "start chromium")
	return browser
}

// newTab opens a tab of browser, closed when the test ends.
func newTab(t *testing.T, browser context.Context) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(tab), "open a tab")
	return tab
}

// do runs steps in tab, failing the test after browserTimeout.
func do(t *testing.T, tab context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserTimeout)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// eval returns the value of the JavaScript expression expr in tab.
func eval[T any](t *testing.T, tab context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, expr)
	return v
}

// command sends one protocol command to the tab.
func command[P any](cmd cdp.Command[P, cdp.Empty], params P) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, cmd, params)
		return err
	})
}

// waitFor polls the JavaScript expression expr in tab until it is true,
// failing the test with what after d.
func waitFor(t *testing.T, tab context.Context, d time.Duration, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(tab, time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s (last error: %v)", d, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// text is the JavaScript expression of the text of the element sel.
func text(sel string) string {
	return fmt.Sprintf(`(document.querySelector(%q) || {textContent: ""}).textContent`, sel)
}

// trafficLoad sends CORE and CLAIM lines to the relay at addr, each about
// every interval, reading and dropping the answers, until stop is called or
// the test ends.
func trafficLoad(t *testing.T, addr string, interval time.Duration) (stop func()) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := nc.Read(buf); err != nil {
				return
			}
		}
	}()
	go func() {
		defer close(stopped)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			line := fmt.Sprintf("L%d|CORE|BAL ACC%d\nM%d|CLAIM|SUBMIT P%d 100\n", i, i%50, i, i%50)
			if i%3 == 0 {
				line += fmt.Sprintf("W%d|CORE|WD ACC%d 99999999\n", i, i%50) // a business rejection
			}
			if _, err := nc.Write([]byte(line)); err != nil {
				return
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			<-stopped
			_ = nc.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// breakerState returns target's state from the relay's /status.
func (r *adminRelay) breakerState(t *testing.T, target string) string {
	t.Helper()
	return statusOf(t, r.status(t), target).State
}

func TestStatusPageInABrowser(t *testing.T) {
	// Given CORE and CLAIM behind a relay whose admin port wants a token,
	// with traffic to both,
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	resetTimeout := "1m" // no probe while the test runs
	if *updateScreenshot {
		resetTimeout = "8s" // failed probes in the picture
	}
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--fail-threshold", "3", "--reset-timeout", resetTimeout, "--admin-token", pageToken, "--dedup")
	browser := newBrowser(t)
	tab := newTab(t, browser)
	do(t, tab, chromedp.Navigate(h.admin+"/"))
	stopTraffic := trafficLoad(t, h.Addr(), 50*time.Millisecond)

	// The page's columns are those of the screenshots in docs/: a column
	// added, removed or renamed since fails here until make screenshot
	// takes them again.
	headers := eval[[]string](t, tab, pageHeadersJS)
	if *updateScreenshot {
		require.NoError(t, os.WriteFile(screenshotColumns, []byte(strings.Join(headers, "\n")+"\n"), 0o644))
	}
	shot, err := os.ReadFile(screenshotColumns)
	require.NoError(t, err)
	assert.Equal(t, strings.Split(strings.TrimSuffix(string(shot), "\n"), "\n"), headers,
		"the status page's columns differ from those of docs/status-page.png: take the screenshots again (make screenshot)")

	// when the operator opens the admin port in a browser, the page lists
	// both targets, closed, and goes live;
	names := eval[[]string](t, tab, `Array.from(document.querySelectorAll("tr.target .tname"), e => e.textContent)`)
	assert.Equal(t, []string{"CORE", "CLAIM"}, names)
	assert.Contains(t, eval[string](t, tab, text("#t-CORE-state")), "CLOSED")
	waitFor(t, tab, 5*time.Second, "the page's stream connects", `document.getElementById("live").className.includes("on")`)
	if *updateScreenshot {
		leadUpToTheOutage(t, core)
	}

	// when CORE fails and trips, its row turns OPEN within 2 s, without a
	// reload, and the timeline shows the open span;
	do(t, tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[chromedp.Void](`window.sameDocument = true`)(ctx, tg)
		return err
	}))
	core.Ctl(t, `{"mode":"fail"}`)
	proctest.Eventually(t, 5*time.Second, "CORE opens", func() bool { return h.breakerState(t, "CORE") == "OPEN" })
	waitFor(t, tab, 2*time.Second, "CORE's row turns OPEN", text("#t-CORE-state")+`.includes("OPEN") && window.sameDocument === true`)
	waitFor(t, tab, 2*time.Second, "the timeline shows the open span", `document.querySelectorAll("#t-CORE-history rect.tl.open").length > 0`)
	waitFor(t, tab, 3*time.Second, "CORE's E904 answers show", text("#t-CORE-answers")+`.includes("E904")`)
	assert.Contains(t, eval[string](t, tab, text("#t-CORE-failure")), "E500")
	assert.Contains(t, eval[string](t, tab, text("#t-CLAIM-state")), "CLOSED")
	if *updateScreenshot {
		time.Sleep(45 * time.Second) // the outage and its failed probes
	}
	screenshots(t, tab)
	stopTraffic()
	proctest.Eventually(t, 5*time.Second, "no probe out", func() bool { return h.breakerState(t, "CORE") == "OPEN" })

	// when the operator closes CORE from the page without the token, the
	// relay refuses and CORE stays open;
	do(t, tab, chromedp.Click(chromedp.CSS(`#t-CORE-control button[data-action="close"]`)))
	waitFor(t, tab, 5*time.Second, "the refusal shows", text("#ctl-result")+`.includes("HTTP 401")`)
	assert.Equal(t, "OPEN", h.breakerState(t, "CORE"))

	// with the token typed in, CORE closes, on the page too.
	core.Ctl(t, `{"mode":"normal"}`)
	do(t, tab,
		chromedp.SendKeys(chromedp.CSS("#token"), pageToken),
		chromedp.Click(chromedp.CSS(`#t-CORE-control button[data-action="close"]`)))
	waitFor(t, tab, 5*time.Second, "the action is confirmed", text("#ctl-result")+`.includes("now CLOSED")`)
	assert.Equal(t, "CLOSED", h.breakerState(t, "CORE"))
	waitFor(t, tab, 2*time.Second, "CORE's row turns CLOSED", text("#t-CORE-state")+`.includes("CLOSED")`)
	assert.NotContains(t, eval[string](t, tab, `document.documentElement.outerHTML`), pageToken, "the token is never put in the page")

	// A page of another origin that posts to the admin port is refused.
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!DOCTYPE html><title>elsewhere</title><script>
fetch(%q, {method: "POST", mode: "no-cors", body: '{"action":"open"}'}).then(() => document.title = "sent", () => document.title = "failed");
</script>`, h.admin+"/breakers/CORE")
	}))
	t.Cleanup(attacker.Close)
	other := newTab(t, browser)
	do(t, other, chromedp.Navigate(attacker.URL))
	waitFor(t, other, 5*time.Second, "the other page's request is sent", `document.title === "sent" || document.title === "failed"`)
	proctest.Eventually(t, 5*time.Second, "the relay logs the refusal", func() bool {
		return strings.Contains(h.Stderr(), "admin request refused: sent from another origin")
	})
	assert.Equal(t, "CLOSED", h.breakerState(t, "CORE"))
}

func TestStatusPageShowsCallsInDoubtLive(t *testing.T) {
	// Given CORE slower than the relay's target timeout, and than its
	// late reading too, so that a transfer ends in doubt and stays open
	// (CORE has no status_url: an operator settles it), and the page open
	// in a browser, live,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"slow","delay_ms":60000}`)
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target", "CLAIM="+closedPortURL(t),
		"--target-timeout", "200ms", "--fail-threshold", "100")
	tab := newTab(t, newBrowser(t))
	do(t, tab, chromedp.Navigate(h.admin+"/"))
	waitFor(t, tab, 5*time.Second, "the page's stream connects", `document.getElementById("live").className.includes("on")`)
	assert.Equal(t, "0", eval[string](t, tab, text("#t-CORE-indoubt")))
	assert.Contains(t, eval[string](t, tab, text("#hub")), "none in doubt")
	do(t, tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[chromedp.Void](`window.sameDocument = true`)(ctx, tg)
		return err
	}))

	// when two transfers time out after CORE took them,
	c := hubtest.Dial(t, h.Addr())
	for _, txid := range []string{"XF-1", "XF-2"} {
		a := c.Exchange(txid + "|CORE|XFER 1001 1002 2500")
		require.Equal(t, "E901", a.Code)
		require.Contains(t, a.Message, "outcome unknown")
	}

	// then CORE's row and the hub's total say 2 within 2 s, without a
	// reload, and CLAIM's row still 0;
	waitFor(t, tab, 2*time.Second, "CORE's row shows its calls in doubt",
		text("#t-CORE-indoubt")+`.startsWith("2") && window.sameDocument === true`)
	waitFor(t, tab, 2*time.Second, "the header shows the hub's total", text("#hub")+`.includes("2 in doubt")`)
	assert.Equal(t, "0", eval[string](t, tab, text("#t-CLAIM-indoubt")))

	// CORE's cell is amber, with how many are open;
	assert.True(t, eval[bool](t, tab, `document.getElementById("t-CORE-indoubt").classList.contains("doubt")`))
	assert.Contains(t, eval[string](t, tab, text("#t-CORE-indoubt")), "2 open · oldest ")

	// the total links to the list of them;
	do(t, tab, chromedp.Click(chromedp.CSS(`#hub a.indoubt`)))
	waitFor(t, tab, 5*time.Second, "the link opens /in-doubt with both transfers",
		`location.pathname === "/in-doubt" && document.body.textContent.includes('"txid":"XF-1"') && document.body.textContent.includes('"txid":"XF-2"')`)

	// and once an operator has settled both, the page, live, takes the
	// amber off and still counts them since start.
	do(t, tab, chromedp.Navigate(h.admin+"/"))
	waitFor(t, tab, 5*time.Second, "the page's stream connects", `document.getElementById("live").className.includes("on")`)
	for _, s := range []struct{ txid, body string }{
		{"XF-1", `{"target":"CORE","applied":true,"code":"0000"}`},
		{"XF-2", `{"target":"CORE","not_applied":true}`},
	} {
		code, answer := adminPost(t, h, "/in-doubt/"+s.txid+"/resolve", s.body, "")
		require.Equal(t, http.StatusOK, code, answer)
	}
	waitFor(t, tab, 2*time.Second, "CORE's cell is no longer amber",
		`!document.getElementById("t-CORE-indoubt").classList.contains("doubt") && `+text("#t-CORE-indoubt")+`.startsWith("2all settled")`)
	assert.Contains(t, eval[string](t, tab, text("#hub")), "none in doubt (2 settled)")
}

func TestStatusPageShowsTheShieldLive(t *testing.T) {
	// Given CORE shielded without a status URL, answering later than the
	// relay's target timeout once told to, and the page open, live,
	core := proctest.StartFixture(t, "CORE", "core")
	h := startShieldedRelay(t, core.URL, "", "--target", "CLAIM="+closedPortURL(t), "--target-timeout", "300ms")
	tab := newTab(t, newBrowser(t))
	do(t, tab, chromedp.Navigate(h.admin+"/"))
	waitFor(t, tab, 5*time.Second, "the page's stream connects", `document.getElementById("live").className.includes("on")`)
	assert.Equal(t, "0 replayed · 0 joinedno status_url", eval[string](t, tab, text("#t-CORE-dedup")))
	assert.Equal(t, "off", eval[string](t, tab, text("#t-CLAIM-dedup")))
	do(t, tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[chromedp.Void](`window.sameDocument = true`)(ctx, tg)
		return err
	}))

	// when a withdrawal is resent, then sent with another amount,
	c := hubtest.Dial(t, h.Addr())
	first := c.Exchange("W1|CORE|WD 1001 500").String()
	require.Equal(t, first, c.Exchange("W1|CORE|WD 1001 500").String())
	require.Equal(t, "E909", c.Exchange("W1|CORE|WD 1001 900").Code)

	// then CORE's shield says so within 2 s, without a reload;
	waitFor(t, tab, 2*time.Second, "CORE's shield counts the replay and the E909",
		text("#t-CORE-dedup")+`.startsWith("1 replayed · 0 joined1 E909") && window.sameDocument === true`)

	// when a withdrawal ends in doubt and is resent, with no status URL to
	// ask, the resend shows unresolved, highlighted as calls in doubt are.
	core.Ctl(t, `{"mode":"late","delay_ms":1000}`)
	require.Equal(t, "E901", c.Exchange("W2|CORE|WD 1001 700").Code)
	require.Equal(t, "W2|E901|outcome still unknown; do not resend yet", c.Exchange("W2|CORE|WD 1001 700").String())
	waitFor(t, tab, 2*time.Second, "CORE's shield shows the unresolved resend",
		text("#t-CORE-dedup")+`.includes("1 unresolved") && document.getElementById("t-CORE-dedup").classList.contains("doubt")`)
	assert.Equal(t, "off", eval[string](t, tab, text("#t-CLAIM-dedup")))
}

func TestStatusPageWithoutJavaScript(t *testing.T) {
	// Given a relay with CORE held open by an operator, and a browser with
	// JavaScript off,
	h := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1", "--target", "CLAIM=http://127.0.0.1:1", "--admin-token", pageToken)
	hold := func(action string) {
		t.Helper()
		code, body := adminPost(t, h, "/breakers/CORE", `{"action":"`+action+`"}`, pageToken)
		require.Equal(t, http.StatusOK, code, body)
	}
	hold("open")
	tab := newTab(t, newBrowser(t))
	do(t, tab,
		command(emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}),
		chromedp.Navigate(h.admin+"/"))

	// when the operator opens the page, it shows the current state, says it
	// is static, and offers no control that would need JavaScript;
	state := eval[string](t, tab, text("#t-CORE-state"))
	live := eval[string](t, tab, text("#live"))
	controls := eval[[]int](t, tab, `Array.from(document.querySelectorAll("button"), b => b.getClientRects().length)`)
	assert.Contains(t, state, "OPEN")
	assert.Contains(t, state, "held open by operator")
	assert.Contains(t, live, "refreshes every 5 s")
	require.NotEmpty(t, controls)
	for _, boxes := range controls {
		assert.Zero(t, boxes, "a control is shown")
	}

	// and when CORE is closed, the page shows it after its own refresh.
	hold("close")
	waitFor(t, tab, 8*time.Second, "the page refreshes to CLOSED", text("#t-CORE-state")+`.includes("CLOSED")`)
}

// adminPost posts body to path on r's admin port with the bearer token,
// and returns the status and body.
func adminPost(t *testing.T, r *adminRelay, path, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.admin+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := adminClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	require.NoError(t, err)
	return resp.StatusCode, string(got)
}

// pageCell returns the cell of the status page with the given id, up to
// its closing tag.
func pageCell(t *testing.T, page, id string) string {
	t.Helper()
	i := strings.Index(page, `<td id="`+id+`"`)
	require.GreaterOrEqual(t, i, 0, "no cell %s in the page", id)
	n := strings.Index(page[i:], "</td>")
	require.Positive(t, n, "cell %s is not closed", id)
	return page[i : i+n+len("</td>")]
}

// screenshots takes the page in tab, light and dark, 1440 px wide: into
// docs/ with -update-screenshot, else into the test's temporary directory
// (so every run checks that it works).
func screenshots(t *testing.T, tab context.Context) {
	t.Helper()
	dir := t.TempDir()
	if *updateScreenshot {
		dir = filepath.Join("..", "..", "docs")
	}
	for _, shot := range []struct{ file, scheme string }{
		{"status-page.png", "light"},
		{"status-page-dark.png", "dark"},
	} {
		do(t, tab,
			command(emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{Width: 1440, Height: 400, DeviceScaleFactor: 1}),
			command(emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: shot.scheme}},
			}),
			chromedp.Sleep(100*time.Millisecond)) // a frame drawn in the new scheme
		ctx, cancel := context.WithTimeout(tab, browserTimeout)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		cancel()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, shot.file), png, 0o644))
	}
	do(t, tab,
		command(emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{}),
		command(emulation.ClearDeviceMetricsOverride, cdp.Empty{}))
}

// leadUpToTheOutage plays what comes before CORE fails in the screenshot
// of -update-screenshot: a minute and a half of normal traffic, then CORE
// slow enough to fill its bulkhead, then normal again.
func leadUpToTheOutage(t *testing.T, core *proctest.Fixture) {
	t.Helper()
	time.Sleep(90 * time.Second)
	core.Ctl(t, `{"mode":"slow","delay_ms":600}`)
	time.Sleep(25 * time.Second)
	core.Ctl(t, `{"mode":"normal"}`)
	time.Sleep(30 * time.Second)
}

// getHTML is GET path on the admin port at base URL admin as a browser asks
// for it.
func getHTML(t *testing.T, admin, path string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, admin+path, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	resp, err := adminClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body), resp.Header
}

func TestStatusPageIsForBrowsersAndCanBeTurnedOff(t *testing.T) {
	// Given a relay with the page on (the default), a browser gets the page
	// and curl the text index;
	h := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1")
	code, body, hdr := getHTML(t, h.admin, "/")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "text/html; charset=utf-8", hdr.Get("Content-Type"))
	assert.Contains(t, body, `id="t-CORE-state"`)
	assert.NotContains(t, body, "STORE CONNECTED", "a hub alone shows no fleet")
	assert.Contains(t, h.mustGet(t, "/"), "relayhub admin\n")

	// given one with --no-status-page, both get the text index and there
	// is no stream.
	off := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1", "--no-status-page")
	code, body, _ = getHTML(t, off.admin, "/")
	assert.Equal(t, http.StatusOK, code)
	assert.True(t, strings.HasPrefix(body, "relayhub admin\n"), body)
	assert.NotContains(t, body, "/events")
	code, _, _ = off.get("/events")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, off.Stderr(), `"status_page":false`)
}

func TestStatusPageStreamEndsCleanlyOnSIGTERM(t *testing.T) {
	// Given a browser's stream open on the status page,
	h := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1")
	events := hubtest.OpenEvents(t, h.admin+"/events")
	next := func() (hubtest.Event, bool) {
		t.Helper()
		return events.Next(t, 5*time.Second)
	}
	for ev, ok := next(); ev.Name != "update"; ev, ok = next() {
		require.True(t, ok, "the stream ended before its first update")
	}

	// when the relay gets SIGTERM, the stream ends with an end event, not
	// cut by the admin server's shutdown timeout, and the relay exits 0.
	h.Signal(syscall.SIGTERM)
	for ev, ok := next(); ev.Name != "end"; ev, ok = next() {
		require.True(t, ok, "the stream ended without an end event")
	}
	_, more := next()
	assert.False(t, more, "nothing after the end event")
	assert.NoError(t, events.Err(), "the stream ends cleanly, not reset")
	assert.Equal(t, 0, h.Wait())
	assert.NotContains(t, h.Stderr(), "admin serve ended with an error")
}

func TestStatusPageFitsTheWindow(t *testing.T) {
	// Given a relay whose page shows about the longest cells it can: CORE
	// shielded, with a fallback, calls in doubt, a resend looked up and
	// one refused, a failure and its message, then held open by an
	// operator while its requests go to CLAIM,
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	conf := writeFile(t, "relay.toml", fmt.Sprintf("[CORE]\ndedup = true\nstatus_url = %q\nfallback = \"CLAIM\"\n", core.URL+"/tx/{txid}"))
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL, "--config", conf,
		"--target-timeout", "300ms", "--fail-threshold", "3", "--admin-token", pageToken)
	c := hubtest.Dial(t, h.Addr())
	core.Ctl(t, `{"mode":"late","delay_ms":1000}`)
	require.Equal(t, "E901", c.Exchange("W1|CORE|WD 1001 500").Code)
	require.Equal(t, "0000", c.Exchange("W1|CORE|WD 1001 500").Code)
	require.Equal(t, "E909", c.Exchange("W1|CORE|WD 1001 900").Code)
	core.Ctl(t, `{"mode":"fail"}`)
	require.Equal(t, "E500", c.Exchange("F0|CORE|BAL 1001").Code)
	for i := 1; h.breakerState(t, "CORE") != "OPEN"; i++ {
		require.Less(t, i, 5, "CORE does not open")
		c.Exchange(fmt.Sprintf("F%d|CORE|BAL 1001", i))
	}
	code, body := adminPost(t, h, "/breakers/CORE", `{"action":"open"}`, pageToken)
	require.Equal(t, http.StatusOK, code, body)
	stopTraffic := trafficLoad(t, h.Addr(), 50*time.Millisecond)
	defer stopTraffic()

	tab := newTab(t, newBrowser(t))
	do(t, tab, chromedp.Navigate(h.admin+"/"))
	waitFor(t, tab, 5*time.Second, "the page's stream connects", `document.getElementById("live").className.includes("on")`)
	waitFor(t, tab, 5*time.Second, "CORE's requests go to CLAIM", text("#t-CORE-fallback")+`.includes("takes CORE's requests")`)
	require.Contains(t, eval[string](t, tab, text("#t-CORE-state")), "held open by operator")
	require.Contains(t, eval[string](t, tab, text("#t-CORE-dedup")), "1 E909")

	// when the window is 1280 px wide, and then 1024, with the page's
	// table or its rows folded into labelled cells,
	for _, size := range []struct{ width, height int64 }{{1280, 800}, {1024, 768}} {
		t.Run(fmt.Sprintf("%dx%d", size.width, size.height), func(t *testing.T) {
			do(t, tab,
				command(emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{Width: size.width, Height: size.height, DeviceScaleFactor: 1}),
				chromedp.Sleep(100*time.Millisecond)) // a frame laid out at the new width

			// then nothing of it lies beyond the window's right edge and
			// nothing in it is cut.
			assert.Empty(t, eval[[]string](t, tab, pageTooWideJS))
		})
	}
	do(t, tab, command(emulation.ClearDeviceMetricsOverride, cdp.Empty{}))
}
