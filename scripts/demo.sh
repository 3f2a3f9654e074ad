#!/usr/bin/env bash
# Walks through what relayhub is for, against real binaries: a CORE and a
# CLAIM fixture and the relay, all on free loopback ports (so a `make run`
# elsewhere is not disturbed). It shows normal traffic, the bulkhead
# answering E905 while CORE is slow, the breaker answering E904 while CORE
# fails (CLAIM keeps answering 0000 throughout), the half-open probe closing
# the breaker once CORE recovers, and the breaker log. It stops with a
# non-zero status and a message at the first step that does not behave as
# the README says. Needs bash, curl and make; talks TCP through bash's /dev/tcp.
set -euo pipefail
cd "$(dirname "$0")/.."

RESET_TIMEOUT=2s
MAX_INFLIGHT=2
SLOW_MS=1500

if [[ ! -x bin/relay || ! -x bin/fixture ]]; then
  make build
fi

work=$(mktemp -d)
pids=()
relay_pid=

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  exec 3<&- 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
  echo "DEMO FAILED: $*" >&2
  if [[ -s "$work/relay.log" ]]; then
    echo "--- last lines of the relay's log ---" >&2
    tail -n 20 "$work/relay.log" >&2
  fi
  exit 1
}

step() { printf '\n== %s ==\n' "$*"; }

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# start_fixture NAME KIND: starts a fixture and sets URL to its base URL.
start_fixture() {
  bin/fixture --name "$1" --kind "$2" --listen 127.0.0.1:0 >/dev/null 2>"$work/$1.log" &
  pids+=($!)
  URL="http://$(wait_addr "$work/$1.log")"
}

# ctl URL JSON: switches a fixture's mode, as an operator would with curl.
ctl() {
  echo "  \$ curl -XPOST $1/_ctl -d '$2'"
  curl -fsS -XPOST "$1/_ctl" -d "$2" >/dev/null || die "fixture control $2 failed"
}

# calls URL: prints how many calls a fixture has received.
calls() { curl -fsS "$1/_stats" | grep -o '"calls":[0-9]*' | cut -d: -f2; }

# send LINE...: writes the lines to the relay connection at once.
send() {
  local l
  for l in "$@"; do echo "  > $l"; done
  printf '%s\n' "$@" >&3
}

# recv N: reads N answers into the array ANSWERS, printing them.
recv() {
  local line
  ANSWERS=()
  for _ in $(seq "$1"); do
    IFS= read -r -t 10 line <&3 || die "no answer from the relay within 10 s"
    echo "  < $line"
    ANSWERS+=("$line")
  done
}

# exchange LINE CODE [MESSAGE-REGEX]: sends one line and checks its answer.
exchange() {
  send "$1"
  recv 1
  local txid=${1%%|*} got=${ANSWERS[0]}
  local code msg
  code=$(cut -d'|' -f2 <<<"$got")
  msg=$(cut -d'|' -f3- <<<"$got")
  [[ "${got%%|*}" == "$txid" ]] || die "answer to $txid has TXID ${got%%|*}"
  [[ "$code" == "$2" ]] || die "$1: want code $2, got: $got"
  if [[ $# -ge 3 ]]; then
    [[ "$msg" =~ $3 ]] || die "$1: message \"$msg\" does not match /$3/"
  fi
}

# count CODE: prints how many of ANSWERS have CODE.
count() {
  local a n=0
  for a in "${ANSWERS[@]}"; do
    [[ "$(cut -d'|' -f2 <<<"$a")" == "$1" ]] && n=$((n + 1))
  done
  echo "$n"
}

step "Starting two fixtures and the relay"
start_fixture CORE core
core=$URL
start_fixture CLAIM claim
claim=$URL
bin/relay --listen 127.0.0.1:0 --admin-listen "" \
  --target "CORE=$core" --target "CLAIM=$claim" \
  --fail-threshold 3 --reset-timeout "$RESET_TIMEOUT" --max-inflight "$MAX_INFLIGHT" \
  --target-timeout 3s --breaker-log "$work/breaker.log" --in-doubt-log "$work/in-doubt.log" >/dev/null 2>"$work/relay.log" &
relay_pid=$!
pids+=("$relay_pid")
relay=$(wait_addr "$work/relay.log")
echo "  CORE fixture at $core, CLAIM fixture at $claim"
echo "  relay at $relay: --fail-threshold 3 --reset-timeout $RESET_TIMEOUT --max-inflight $MAX_INFLIGHT"
exec 3<>"/dev/tcp/${relay%:*}/${relay##*:}" || die "cannot connect to the relay at $relay"

step "1. Normal traffic: one line per transaction, one answer each"
exchange "t1|CORE|BAL ACC1" 0000 '^balance=100000$'
exchange "t2|CORE|WD ACC1 500" 0000 '^balance=99500$'
exchange "t3|core|WD ACC1 99999999" B201
exchange "t4|CLAIM|SUBMIT POL7 2500" 0000
exchange "t5|PAYROLL|x" E903

step "2. CORE slow: its bulkhead (--max-inflight $MAX_INFLIGHT) answers E905 at once"
ctl "$core" "{\"mode\":\"slow\",\"delay_ms\":$SLOW_MS}"
send "s1|CORE|BAL ACC1" "s2|CORE|BAL ACC2" "s3|CORE|BAL ACC3" "s4|CORE|BAL ACC4" "s5|CORE|BAL ACC5"
recv 3
[[ "$(count E905)" == 3 ]] || die "want 3 immediate E905 answers while CORE is full"
echo "  ... CLAIM is not affected:"
exchange "s6|CLAIM|SUBMIT POL8 100" 0000
echo "  ... the two admitted CORE calls finish after ${SLOW_MS} ms:"
recv 2
[[ "$(count 0000)" == 2 ]] || die "want the 2 admitted slow CORE calls to answer 0000"
peak=$(curl -fsS "$core/_stats" | grep -o '"max_inflight":[0-9]*' | cut -d: -f2)
echo "  CORE fixture's peak of calls in flight: $peak"
[[ "$peak" == "$MAX_INFLIGHT" ]] || die "CORE saw $peak calls at once, want $MAX_INFLIGHT"

step "3. CORE fails: 3 failures in a row open its breaker; then E904 without calling CORE"
ctl "$core" '{"mode":"fail"}'
exchange "f1|CORE|BAL ACC1" E500
exchange "f2|CORE|BAL ACC1" E500
exchange "f3|CORE|BAL ACC1" E500
before=$(calls "$core")
exchange "f4|CORE|BAL ACC1" E904 '^circuit open; retry after [0-9]+s$'
exchange "f5|CORE|BAL ACC1" E904 '^circuit open; retry after [0-9]+s$'
after=$(calls "$core")
echo "  CORE fixture calls before/after the two E904s: $before/$after"
[[ "$before" == "$after" ]] || die "an open breaker called CORE"
echo "  ... CLAIM keeps answering:"
exchange "f6|CLAIM|SUBMIT POL9 100" 0000

step "4. CORE recovers: after the reset timeout one probe closes the breaker"
ctl "$core" '{"mode":"normal"}'
exchange "r1|CORE|BAL ACC1" E904 '^circuit open; retry after [0-9]+s$'
wait_s=$(grep -o '[0-9]*s$' <<<"${ANSWERS[0]}" | tr -d s)
echo "  (waiting ${wait_s}s, as the E904 message says)"
sleep "$wait_s"
probe=
for i in $(seq 20); do
  send "r2-$i|CORE|BAL ACC1"
  recv 1
  code=$(cut -d'|' -f2 <<<"${ANSWERS[0]}")
  if [[ "$code" != E904 ]]; then
    probe=$code
    break
  fi
  sleep 0.25
done
[[ "$probe" == 0000 ]] || die "the probe after the reset timeout did not answer 0000 (got ${probe:-only E904})"
exchange "r3|CORE|BAL ACC1" 0000
exchange "r4|CLAIM|STATUS CLM-404" B212

step "5. SIGTERM: the relay drains and exits 0; its breaker log"
exec 3<&-
kill -TERM "$relay_pid"
status=0
wait "$relay_pid" || status=$?
[[ "$status" == 0 ]] || die "the relay exited with status $status after SIGTERM, want 0"
echo "  relay exited with status 0"
echo "  \$ cat breaker.log"
sed 's/^/  /' "$work/breaker.log"
transitions=$(cut -d'|' -f2- "$work/breaker.log" | tr '\n' ' ')
want="CORE|CLOSED->OPEN CORE|OPEN->HALF_OPEN CORE|HALF_OPEN->CLOSED "
[[ "$transitions" == "$want" ]] || die "breaker log holds \"$transitions\", want \"$want\""

printf '\nDemo OK: every step behaved as the README describes.\n'
