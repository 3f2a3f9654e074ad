package tlsfiles_test

import (
	"crypto/tls"
	"fmt"

	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// ExampleLoadServer shows what stops a hub at start, or keeps its old
// certificate on a reload: a file that cannot be used, named in the error.
func ExampleLoadServer() {
	_, err := tlsfiles.LoadServer(tlsfiles.ServerFiles{CertFile: "missing.crt", KeyFile: "missing.key"})
	fmt.Println(err)
	// Output:
	// certificate: open missing.crt: no such file or directory
}

// ExampleClient builds the TLS configuration of a connection to an https
// target that uses the system's roots and a name of its own.
func ExampleClient() {
	cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{ServerName: "core.bank.example"})
	if err != nil {
		panic(err)
	}
	fmt.Println(cfg.ServerName, cfg.MinVersion == tls.VersionTLS12)
	// Output:
	// core.bank.example true
}
