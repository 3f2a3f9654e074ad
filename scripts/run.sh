#!/usr/bin/env bash
# Starts a CORE and a CLAIM fixture and the relay with its defaults, all in
# the foreground. Ctrl-C (or SIGTERM) stops all three. Extra arguments go to
# the relay.
set -euo pipefail
cd "$(dirname "$0")/.."

bin/fixture --name CORE --kind core --listen 127.0.0.1:9201 &
core=$!
bin/fixture --name CLAIM --kind claim --listen 127.0.0.1:9202 &
claim=$!
trap 'kill -TERM "$core" "$claim" 2>/dev/null || true; wait "$core" "$claim" 2>/dev/null || true' EXIT

bin/relay "$@"
