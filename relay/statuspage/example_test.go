package statuspage_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/statuspage"
)

// ExampleNew wires the page to a hub, holds CORE open as an operator
// would, and draws the page a browser gets.
func ExampleNew() {
	rec := statuspage.NewRecorder()
	srv, err := relay.New(relay.Config{
		Targets:      []relay.Target{{Name: "CORE", URL: "http://127.0.0.1:9201"}},
		OnTransition: rec.Observe,
	})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	page, err := statuspage.New(statuspage.Config{Hub: srv, Recorder: rec})
	if err != nil {
		panic(err)
	}
	defer page.Close()

	if _, err := srv.ControlBreaker("CORE", relay.ActionOpen); err != nil {
		panic(err)
	}
	w := httptest.NewRecorder()
	page.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	fmt.Println(strings.Contains(w.Body.String(), "held open by operator"))
	// Output:
	// 200 text/html; charset=utf-8
	// true
}
