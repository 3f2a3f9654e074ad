#!/usr/bin/env bash
# Starts a CORE and a CLAIM fixture and the relay with its defaults, and
# waits. SIGTERM or SIGINT (Ctrl-C) to this script stops all three, waits
# for them to exit, so nothing is left holding the ports, and exits 0 when
# all three stopped cleanly; SIGHUP does the same and exits 129. The end of
# any one of them ends the run with its status. Extra arguments go to the
# relay.
#
# Environment: RELAYHUB_BIN, the directory of the binaries (default bin);
# CORE_LISTEN and CLAIM_LISTEN, the fixtures' addresses (default
# 127.0.0.1:9201 and 127.0.0.1:9202), which the relay's targets follow
# unless RELAY_TARGET is set. The relay reads its other RELAY_* variables
# itself (RELAY_LISTEN, RELAY_ADMIN_LISTEN, RELAY_BREAKER_LOG, ...).
#
# A second copy beside the first needs other ports only: when RELAY_LISTEN's
# port is not 9200, the breaker log and the in-doubt journal are
# breaker-PORT.log and in-doubt-PORT.log unless RELAY_BREAKER_LOG and
# RELAY_IN_DOUBT_LOG say otherwise, so the copies never share a file:
#
#   CORE_LISTEN=127.0.0.1:9301 CLAIM_LISTEN=127.0.0.1:9302 \
#     RELAY_LISTEN=127.0.0.1:9300 RELAY_ADMIN_LISTEN=127.0.0.1:9380 make run
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${RELAYHUB_BIN:-bin}
core_listen=${CORE_LISTEN:-127.0.0.1:9201}
claim_listen=${CLAIM_LISTEN:-127.0.0.1:9202}
export RELAY_TARGET=${RELAY_TARGET:-CORE=http://$core_listen,CLAIM=http://$claim_listen}
port=${RELAY_LISTEN:-127.0.0.1:9200}
port=${port##*:}
if [[ $port != 9200 ]]; then
  export RELAY_BREAKER_LOG=${RELAY_BREAKER_LOG:-breaker-$port.log}
  # An empty RELAY_IN_DOUBT_LOG, which turns the journal off, is kept.
  export RELAY_IN_DOUBT_LOG=${RELAY_IN_DOUBT_LOG-in-doubt-$port.log}
fi

pids=()
status=0
# stop: SIGTERM to every process started here, then wait for each; status
# becomes the last bad exit status among them. Ended by SIGTERM or SIGINT
# (143, 130) is not bad: a process that has just stopped on the terminal's
# signal may get this SIGTERM after it put the default action back. Another
# signal to this script meanwhile, such as the SIGTERM make passes on after
# its own, must not cut a wait short: the processes have been told.
stop() {
  trap '' HUP INT TERM
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local pid s
  for pid in "${pids[@]}"; do
    s=0
    wait "$pid" 2>/dev/null || s=$?
    # -1: bash lost the status of one reaped as its wait -n was cut short.
    if ((s > 0 && s != 130 && s != 143)); then
      status=$s
    fi
  done
  pids=()
}
trap stop EXIT
trap 'stop; exit 129' HUP
# Stopped on request: a clean stop of all three is a success.
trap 'stop; exit "$status"' INT TERM

"$bin/fixture" --name CORE --kind core --listen "$core_listen" &
pids+=($!)
"$bin/fixture" --name CLAIM --kind claim --listen "$claim_listen" &
pids+=($!)
"$bin/relay" "$@" &
pids+=($!)

# All three run in the background so that a signal reaches the traps at
# once (bash runs a trap only after a foreground command ends). The first
# to end, say the relay on a bad flag, ends the run with its status.
first=0
wait -n || first=$?
exit "$first"
