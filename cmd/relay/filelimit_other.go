//go:build !unix

package main

import "github.com/relayhub/relayhub/relay"

// checkFileLimit does nothing where there is no RLIMIT_NOFILE.
func checkFileLimit(*relay.Server, int, string) error { return nil }
