package reconcile_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// Example reconciles a journal of two in-doubt withdrawals against a core
// fixture that booked the first and never saw the second.
func Example() {
	srv, err := fixtures.New(fixtures.Config{Kind: fixtures.KindCore})
	if err != nil {
		fmt.Println(err)
		return
	}
	core := httptest.NewServer(srv)
	defer core.Close()
	req, _ := http.NewRequest(http.MethodPost, core.URL+"/tx", strings.NewReader("WD ACC1 500"))
	req.Header.Set("X-Tx-Id", "T1")
	resp, err := core.Client().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()

	journal := fmt.Sprintf(`{"txid":"T1","target":"CORE","url":%q,"code":"E901","stage":"request_sent"}
{"txid":"T2","target":"CORE","url":%q,"code":"E902","stage":"request_partly_sent"}
`, core.URL, core.URL)
	entries, bad, err := reconcile.ReadJournal(strings.NewReader(journal))
	if err != nil {
		fmt.Println(err)
		return
	}
	results := reconcile.New(reconcile.Config{}).Check(context.Background(), entries)
	for _, r := range results {
		fmt.Println(r.TxID, r.Outcome, r.Answer)
	}
	sum := reconcile.Summarize(results, bad)
	fmt.Println("settled:", sum.Settled())
	// Output:
	// T1 applied &{0000 balance=99500}
	// T2 not_applied <nil>
	// settled: true
}
