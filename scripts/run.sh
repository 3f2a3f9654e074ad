#!/usr/bin/env bash
# Starts a CORE and a CLAIM fixture and the relay with its defaults, and
# waits. SIGTERM, SIGINT (Ctrl-C) or SIGHUP to this script stops all three
# and waits for them to exit, so nothing is left holding the ports; so does
# the end of any one of them. Extra arguments go to the relay.
#
# Environment: RELAYHUB_BIN, the directory of the binaries (default bin);
# CORE_LISTEN and CLAIM_LISTEN, the fixtures' addresses (default
# 127.0.0.1:9201 and 127.0.0.1:9202), which the relay's targets follow
# unless RELAY_TARGET is set. The relay reads its other RELAY_* variables
# itself (RELAY_LISTEN, RELAY_ADMIN_LISTEN, RELAY_BREAKER_LOG, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${RELAYHUB_BIN:-bin}
core_listen=${CORE_LISTEN:-127.0.0.1:9201}
claim_listen=${CLAIM_LISTEN:-127.0.0.1:9202}
export RELAY_TARGET=${RELAY_TARGET:-CORE=http://$core_listen,CLAIM=http://$claim_listen}

pids=()
# stop: SIGTERM to every process started here, then wait for them all.
stop() {
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
}
trap stop EXIT
trap 'stop; exit 129' HUP
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM

"$bin/fixture" --name CORE --kind core --listen "$core_listen" &
pids+=($!)
"$bin/fixture" --name CLAIM --kind claim --listen "$claim_listen" &
pids+=($!)
"$bin/relay" "$@" &
pids+=($!)

# All three run in the background so that a signal reaches the traps at
# once (bash runs a trap only after a foreground command ends). The first
# to end, say the relay on a bad flag, ends the run with its status.
status=0
wait -n || status=$?
exit "$status"
