package relay_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"

	"github.com/relayhub/relayhub/relay"
)

// Example relays one transaction to a target and prints the hub's answer.
func Example() {
	core := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payload, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"code":"0000","message":"got %s"}`, payload)
	}))
	defer core.Close()

	srv, err := relay.New(relay.Config{Targets: []relay.Target{{Name: "CORE", URL: core.URL}}})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		panic(err)
	}
	defer c.Close()
	fmt.Fprint(c, "TX1|core|BAL 42\n")
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		panic(err)
	}
	fmt.Print(answer)
	// Output: TX1|0000|got BAL 42
}
