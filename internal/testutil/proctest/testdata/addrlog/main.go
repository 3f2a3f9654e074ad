// Command addrlog is a minimal binary for the proctest tests: it listens on
// --listen, logs the bound address as a JSON line with an "addr" field, and
// answers each line TXID|rest with TXID|0000|rest until SIGTERM, when it
// exits 0. With --exit N it writes one line to stderr and exits N at once;
// with --print-env it prints its RELAY_ variables to stdout first.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	exit := flag.Int("exit", -1, "exit at once with this status")
	printEnv := flag.Bool("print-env", false, "print RELAY_ variables to stdout")
	flag.Parse()

	if *printEnv {
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "RELAY_") {
				fmt.Println(kv)
			}
		}
	}
	if *exit >= 0 {
		fmt.Fprintf(os.Stderr, "addrlog: exiting with status %d\n", *exit)
		os.Exit(*exit)
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	line, _ := json.Marshal(map[string]string{"level": "info", "addr": ln.Addr().String(), "message": "listening"})
	fmt.Fprintf(os.Stderr, "not json\n%s\n", line)

	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	<-sigs
	ln.Close()
	fmt.Fprintln(os.Stderr, `{"level":"info","message":"stopped"}`)
}

func serve(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		txid, rest, _ := strings.Cut(sc.Text(), "|")
		fmt.Fprintf(c, "%s|0000|%s\n", txid, rest)
	}
}
