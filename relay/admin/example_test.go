package admin_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
)

// ExampleNew holds a target's breaker open by hand, as an operator would
// during a maintenance window, and reads the target's state back.
func ExampleNew() {
	srv, err := relay.New(relay.Config{Targets: []relay.Target{{Name: "CORE", URL: "http://127.0.0.1:9201"}}})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	h, err := admin.New(admin.Config{Hub: srv, Token: "change-me"})
	if err != nil {
		panic(err)
	}

	req := httptest.NewRequest(http.MethodPost, "/breakers/core", strings.NewReader(`{"action":"open"}`))
	req.Header.Set("Authorization", "Bearer change-me")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var core admin.Target
	if err := json.Unmarshal(rec.Body.Bytes(), &core); err != nil {
		panic(err)
	}
	fmt.Println(rec.Code, core.Name, core.State, "held:", core.Held)

	// With a token, reads from beyond loopback need it too.
	req = httptest.NewRequest(http.MethodGet, "/status", nil)
	req.Header.Set("Authorization", "Bearer change-me")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var st admin.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		panic(err)
	}
	fmt.Println(rec.Code, st.Targets[0].Name, st.Targets[0].State, "draining:", st.Draining)
	// Output:
	// 200 CORE OPEN held: true
	// 200 CORE OPEN draining: false
}
