package filelimit_test

import (
	"fmt"

	"github.com/relayhub/relayhub/internal/filelimit"
)

func Example() {
	// The defaults: --max-conns 10000, two targets with bulkheads of 10,
	// no fleet.
	fmt.Println(filelimit.Needed(10000, []int{10, 10}, filelimit.StoreConns(false)))
	// Output: 11140
}
