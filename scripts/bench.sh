#!/usr/bin/env bash
# Runs the end-to-end benchmarks of docs/BENCHMARKS.md against the real
# binaries, on free loopback ports, and prints a table of medians with
# min–max over RUNS runs, then the targets of the performance record with
# MET or NOT MET. Every load is driven by the same tool, relaybench load, so
# the hub and its references (redis-server answering inline PING, a fixture
# spoken to straight over HTTP keep-alive) share one load generator and one
# histogram. Runs of the two sides of a comparison alternate, so a noisy
# neighbour on the machine hurts both alike.
#
# Scenarios:
#   1. fast-fail: CORE's breaker held open; 64 connections at depth 1 and
#      16; against redis-server PING at the same connections and depth.
#      With BEFORE_RELAY set, a relay of that binary too, interleaved.
#   2. full path: relay -> fixture (BAL) at 16 and 64 connections in a
#      closed loop, and 16 paced at FULL_RATE, against the same load
#      straight to the fixture. Closed loop measures throughput (and p99
#      under saturation, mostly queueing); paced measures added latency.
#   3. isolation: CORE slow; 500 connections hammer CORE (flat out, then
#      paced at STORM_RATE) while 16 send CLAIM at a fixed rate; against the
#      same CLAIM load with CORE idle. CLAIM latency is that of the answers
#      CLAIM processed (0000/Bnnn): fast E905s must not flatter it. Then
#      (3b) CORE open: its target dead and its breaker tripped, so every
#      CORE line is refused E904 at once; 500 connections send CORE lines
#      flat out while CLAIM runs as above, against CLAIM alone, round by
#      round; with BEFORE_RELAY set, the same on that relay binary too, in
#      the same rounds (before/after a change). SCENARIOS=3a runs only the
#      slow part, SCENARIOS=3b only the open part.
#   4. memory: IDLE_CONNS idle connections, cold (never used) and warm (one
#      line each first); RSS per connection of the relay and of redis-server
#      (the same relaybench idle, speaking PING), a fresh server every run,
#      the two in turn, ratio per round. BASE_RELAY=PATH adds a third side,
#      another relay binary (say, main's, built into /tmp), in the same
#      rounds, with the ratio of this tree's relay to it: a before/after
#      comparison in one run.
#   5. micro-benchmarks of breaker, bulkhead and the relay's line path.
#   6. fleet mode: fast-fail and full path through a relay with
#      --state-store (a Redis of its own) against the same relay without,
#      alternating; and the propagation of a trip between three hubs
#      (p50/p99 over 20 trips, the integration test without the race
#      detector).
#   7. the status page on and off: the full path at 64 connections and
#      fast-fail at depth 16, each against a relay with the page on and a
#      browser's stream open and one with --no-status-page, alternating.
#   8. TLS: scenario 1 (depth 1 and 16) and scenario 2 (64 conns) over
#      mutual TLS against the same in plain TCP, alternating; idle memory
#      of TLS connections; connections per second, plain, TLS with full
#      handshakes and TLS resuming sessions (relaybench connect). The
#      certificates are made with openssl for the run (tls_bench).
#   9. full path against HAProxy: the same raw keep-alive HTTP target
#      (relaybench target, a few µs per answer) behind the hub, behind
#      HAProxy (mode http, http-reuse always, server maxconn = the hub's
#      bulkhead, FULL_INFLIGHT) and spoken to directly, at 16 and 64
#      connections in a closed loop, the three runs of each round in turn;
#      replies/s and server CPU per transaction, ratios per round
#      (proxy_bench). STRACE=1 then counts each proxy's syscalls per
#      transaction with strace -c under a 16-connection load.
#      BEFORE_RELAY=PATH (or BASE_RELAY=PATH, for this scenario alone)
#      adds another relay binary (say, main's, built into /tmp) as a fourth
#      side of each round, against the same target, with the ratio of this
#      tree's hub to it per round, and its syscalls with STRACE=1: a
#      before/after comparison in one run.
#  10. the duplicate-TXID shield: the full path against scenario 9's raw
#      target with the shield off, on with the hub's memory (--dedup), and
#      on shared through a Redis (--dedup --state-store), at 16 and 64
#      connections, the three in turn each round; replies/s and the CPU per
#      transaction of relay, target and Redis together, ratios to off per
#      round (dedup_bench).
#  11. the adaptive limit (about 45 minutes; only with SCENARIOS=11, never
#      by default): a CORE fixture of ADAPT_WORKERS workers of
#      ADAPT_SERVICE_MS each, healthy for ADAPT_HEALTHY s, its workers
#      halved at run time (POST /_ctl) for ADAPT_DEGRADED s, restored for
#      ADAPT_RESTORED s, under open-loop load at 0.9 of its healthy
#      capacity; a hub with --max-inflight ADAPT_LIMIT (the default, 10),
#      one with twice that, and one with --adaptive-limit on under the
#      ceiling of twice that, in turn each round. The breaker never trips
#      (--fail-threshold 1000000): the bulkhead alone decides. Per phase
#      (relaybench load --phase): 0000/s, p50/p99, E905 share, E901 count,
#      when relay_bulkhead_limit settled (read each second, --watch-url)
#      and when E905 fell under 1 % for 5 s in a row (adaptive_bench).
#
# Installs redis-server (and, for scenario 9, haproxy and with STRACE=1
# strace) from Debian when it is missing (needs root). The raw
# JSON of every run stays in BENCH_OUT (a new temporary directory by
# default). Takes about 7 minutes with the defaults below; SCENARIOS="2 6"
# runs only those (SCENARIOS=7: the status page alone, about two minutes;
# SCENARIOS=9, HAProxy, about two minutes, three with STRACE=1).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}                   # runs per measurement (the median needs 3)
DURATION=${DURATION:-5}           # seconds per load run
CONNS_FASTFAIL=${CONNS_FASTFAIL:-64}
FULL_INFLIGHT=${FULL_INFLIGHT:-256} # relay --max-inflight for scenario 2
FULL_RATE=${FULL_RATE:-2000}      # the paced run of scenario 2, requests/s on 16 conns
SLOW_MS=${SLOW_MS:-200}           # CORE's delay in scenario 3
STORM_CONNS=${STORM_CONNS:-500}
CLAIM_CONNS=${CLAIM_CONNS:-16}
CLAIM_RATE=${CLAIM_RATE:-1000}    # CLAIM requests/s in scenario 3
STORM_RATE=${STORM_RATE:-10000}   # the paced storm of scenario 3, requests/s
IDLE_CONNS=${IDLE_CONNS:-10000}
IDLE_HOLD=${IDLE_HOLD:-5s}
STRACE=${STRACE:-0}               # scenario 9: also count syscalls per transaction
STRACE_SECONDS=${STRACE_SECONDS:-3}
BEFORE_RELAY=${BEFORE_RELAY:-}    # another relay binary (say, main's), measured beside this tree's in the same rounds: scenarios 1, 3b, 4 and 9
BASE_RELAY=${BASE_RELAY:-}        # scenarios 4 and 9's other relay, when it is to differ from BEFORE_RELAY
BASE_LABEL=${BASE_LABEL:-}        # its name in scenarios 4 and 9's tables: base, or before when it is BEFORE_RELAY
if [[ -z $BASE_RELAY ]]; then
  BASE_RELAY=$BEFORE_RELAY
  BASE_LABEL=${BASE_LABEL:-before}
fi
BASE_LABEL=${BASE_LABEL:-base}
ADAPT_WORKERS=${ADAPT_WORKERS:-8}        # scenario 11: the target's workers while healthy
ADAPT_SERVICE_MS=${ADAPT_SERVICE_MS:-25} # and each call's service time
ADAPT_TIMEOUT=${ADAPT_TIMEOUT:-100ms}     # the hub's --target-timeout
ADAPT_LIMIT=${ADAPT_LIMIT:-10}           # today's default --max-inflight
ADAPT_CONNS=${ADAPT_CONNS:-16}
ADAPT_HEALTHY=${ADAPT_HEALTHY:-120}      # seconds of each phase
ADAPT_DEGRADED=${ADAPT_DEGRADED:-90}
ADAPT_RESTORED=${ADAPT_RESTORED:-60}
SCENARIOS=${SCENARIOS:-1 2 3 4 5 6 7 8 9 10}

# want N: whether scenario N is to run; 3a and 3b, the parts of scenario 3,
# run with 3 too.
want() {
  [[ " $SCENARIOS " == *" $1 "* ]] && return
  [[ $1 == 3[ab] ]] && want 3
}
for v in BEFORE_RELAY BASE_RELAY; do
  [[ -z ${!v} || -x ${!v} ]] || { echo "bench: $v=${!v} is not an executable" >&2; exit 1; }
done

# ---------------------------------------------------------------- setup --

need_cmd() { # CMD DEBIAN-PACKAGE
  command -v "$1" >/dev/null && return
  if [[ $(id -u) -ne 0 ]]; then
    echo "bench: $1 is missing; install the Debian package $2" >&2
    exit 1
  fi
  echo "bench: installing $2 from Debian" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  fi
}
need_cmd redis-server redis-server
need_cmd jq jq
need_cmd curl curl

make build >/dev/null

out=${BENCH_OUT:-$(mktemp -d /tmp/relayhub-bench.XXXXXX)}
mkdir -p "$out"
pids=()

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
  echo "bench: $*" >&2
  exit 1
}

# Both ends of IDLE_CONNS connections, plus some, must fit the limit.
ulimit -n "$(ulimit -Hn)"
(($(ulimit -n) > IDLE_CONNS + 100)) ||
  die "open file limit $(ulimit -n) is too low for IDLE_CONNS=$IDLE_CONNS"

# forget PID: drops an ended process from the ones cleanup stops.
forget() {
  local keep=() p
  for p in "${pids[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  pids=("${keep[@]}")
}

# stop PID: ends one process this script started.
stop() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  forget "$1"
}

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# start_fixture NAME KIND [ARGS...]: sets FIX_URL and FIX_PID.
start_fixture() {
  local name=$1 kind=$2
  shift 2
  bin/fixture --name "$name" --kind "$kind" --listen 127.0.0.1:0 "$@" >/dev/null 2>"$out/fixture-$name.log" &
  FIX_PID=$!
  pids+=("$FIX_PID")
  FIX_URL="http://$(wait_addr "$out/fixture-$name.log")"
}

# start_relay LOGNAME ARGS...: sets HUB_ADDR and HUB_PID. The admin
# port is on, as by default, so the metrics are counted as in production.
# HUB_BIN, when set, is the relay binary to start instead of bin/relay.
start_relay() {
  local name=$1
  shift
  : >"$out/relay-$name.log"
  "${HUB_BIN:-bin/relay}" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --breaker-log "$out/breaker-$name.log" --in-doubt-log "$out/in-doubt-$name.log" "$@" \
    >/dev/null 2>"$out/relay-$name.log" &
  HUB_PID=$!
  pids+=("$HUB_PID")
  HUB_ADDR=$(wait_addr "$out/relay-$name.log")
}

# trip_core ADDR: the one call that trips the CORE breaker of the relay at
# ADDR, started with a dead CORE and --fail-threshold 1 (refused by the
# closed port, E902), and a check that the next is refused E904.
trip_core() {
  bin/relayctl send --addr "$1" CORE "BAL ACC1" >/dev/null || true
  answer=$(bin/relayctl send --addr "$1" CORE "BAL ACC1" || true)
  [[ $answer == *"|E904|"* ]] || die "CORE's breaker did not open on the relay at $1: $answer"
}

# start_redis: sets REDIS_ADDR and REDIS_PID.
start_redis() {
  local port
  port=$(free_port)
  # Emptied here, before redis starts: a log still holding an earlier
  # redis's "Ready" line would end the wait below too soon.
  : >"$out/redis.log"
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --daemonize no --maxclients 20000 >>"$out/redis.log" 2>&1 &
  REDIS_PID=$!
  pids+=("$REDIS_PID")
  REDIS_ADDR=127.0.0.1:$port
  for _ in $(seq 200); do
    grep -q "Ready to accept connections" "$out/redis.log" && return
    sleep 0.05
  done
  die "redis-server did not start: $(tail -n 5 "$out/redis.log")"
}

# load NAME ARGS...: one relaybench load run, its JSON summary kept as
# NAME.json. A run with unmatched or missing answers still counts; its
# errors show in the table.
load() {
  local name=$1
  shift
  bin/relaybench load --quiet --json --duration "${DURATION}s" --drain 2s "$@" >"$out/$name.json" ||
    echo "bench: $name: relaybench load exited $? (see $out/$name.json)" >&2
}

# ------------------------------------------------------------- 8. TLS --

# tls_bench runs scenario 8, TLS against plain in the same run: fast-fail,
# full path, idle memory, connections per second (CONNECT_WORKERS, 8, at a
# time). Its certificates are made with openssl.
tls_bench() {
  need_cmd openssl openssl
  echo "bench: 8. TLS: fast-fail, full path, idle memory, connections per second" >&2
  tls=$out/tls
  mkdir -p "$tls"
  # leaf NAME SAN USAGE: a P-256 certificate of the run's CA.
  leaf() {
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
      -keyout "$tls/$1.key" -out "$tls/$1.csr" 2>/dev/null
    openssl x509 -req -in "$tls/$1.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 2 \
      -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$2" "$3") -out "$tls/$1.crt" 2>/dev/null
  }
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench-CA \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  leaf hub IP:127.0.0.1 serverAuth
  leaf bench-client DNS:bench-client clientAuth
  hub_tls=(--tls-cert "$tls/hub.crt" --tls-key "$tls/hub.key" --tls-client-ca "$tls/ca.pem")
  client_tls=(--ca "$tls/ca.pem" --cert "$tls/bench-client.crt" --key "$tls/bench-client.key")

  closed=$(free_port)
  start_relay tls-ff-plain --target "CORE=http://127.0.0.1:$closed" --fail-threshold 1 --reset-timeout 1h
  tp_relay=$HUB_PID tp_addr=$HUB_ADDR
  start_relay tls-ff-tls --target "CORE=http://127.0.0.1:$closed" --fail-threshold 1 --reset-timeout 1h "${hub_tls[@]}"
  tt_relay=$HUB_PID tt_addr=$HUB_ADDR
  bin/relayctl send --addr "$tp_addr" CORE "BAL ACC1" >/dev/null || true
  bin/relayctl send --addr "$tt_addr" "${client_tls[@]}" CORE "BAL ACC1" >/dev/null || true
  answer=$(bin/relayctl send --addr "$tt_addr" "${client_tls[@]}" CORE "BAL ACC1" || true)
  [[ $answer == *"|E904|"* ]] || die "CORE's breaker did not open over TLS: $answer"
  for run in $(seq "$RUNS"); do
    for d in 1 16; do
      load "s8-ff-plain-d$d-$run" --addr "$tp_addr" --conns "$CONNS_FASTFAIL" --depth "$d" --server-pid "$tp_relay"
      load "s8-ff-tls-d$d-$run" --addr "$tt_addr" --conns "$CONNS_FASTFAIL" --depth "$d" --server-pid "$tt_relay" "${client_tls[@]}"
    done
  done
  stop "$tp_relay"
  stop "$tt_relay"

  # Full path: plain on both sides, TLS from the clients, TLS on both sides
  # (an https fixture that wants the hub's client certificate).
  start_fixture CORE core
  tf_fix=$FIX_PID tf_url=$FIX_URL
  start_fixture CORE-TLS core --tls-cert "$tls/hub.crt" --tls-key "$tls/hub.key" --tls-client-ca "$tls/ca.pem"
  ts_fix=$FIX_PID
  ts_url="https://${FIX_URL#http://}"
  printf '[CORE]\nurl = "%s"\nca_file = "ca.pem"\nclient_cert = "bench-client.crt"\nclient_key = "bench-client.key"\n' \
    "$ts_url" >"$tls/both.toml"
  start_relay tls-full-plain --target "CORE=$tf_url" --max-inflight "$FULL_INFLIGHT"
  fa_relay=$HUB_PID fa_addr=$HUB_ADDR
  start_relay tls-full-client --target "CORE=$tf_url" --max-inflight "$FULL_INFLIGHT" "${hub_tls[@]}"
  fb_relay=$HUB_PID fb_addr=$HUB_ADDR
  start_relay tls-full-both --max-inflight "$FULL_INFLIGHT" --config "$tls/both.toml" "${hub_tls[@]}"
  fc_relay=$HUB_PID fc_addr=$HUB_ADDR
  for run in $(seq "$RUNS"); do
    load "s8-full-plain-$run" --addr "$fa_addr" --conns 64 --payload 'BAL ACC{conn}' --server-pid "$fa_relay" --server-pid "$tf_fix"
    load "s8-full-client-$run" --addr "$fb_addr" --conns 64 --payload 'BAL ACC{conn}' --server-pid "$fb_relay" --server-pid "$tf_fix" "${client_tls[@]}"
    load "s8-full-both-$run" --addr "$fc_addr" --conns 64 --payload 'BAL ACC{conn}' --server-pid "$fc_relay" --server-pid "$ts_fix" "${client_tls[@]}"
  done
  stop "$fa_relay"
  stop "$fb_relay"
  stop "$fc_relay"
  stop "$tf_fix"
  stop "$ts_fix"

  closed=$(free_port)
  for run in $(seq "$RUNS"); do
    for mode in cold warm; do
      start_relay "tls-idle-$mode-$run" --target "CORE=http://127.0.0.1:$closed" "${hub_tls[@]}"
      warm=()
      [[ $mode == warm ]] && warm=(--warm)
      bin/relaybench idle --json --addr "$HUB_ADDR" --conns "$IDLE_CONNS" --hold "$IDLE_HOLD" "${warm[@]}" \
        --server-pid "$HUB_PID" "${client_tls[@]}" >"$out/s8-idle-$mode-$run.json" ||
        echo "bench: TLS idle $mode run $run: relaybench idle exited $?" >&2
      stop "$HUB_PID"
    done
  done

  start_relay tls-connect-plain --target "CORE=http://127.0.0.1:$closed"
  cp_relay=$HUB_PID cp_addr=$HUB_ADDR
  start_relay tls-connect-tls --target "CORE=http://127.0.0.1:$closed" "${hub_tls[@]}"
  ct_relay=$HUB_PID ct_addr=$HUB_ADDR
  # connect NAME ARGS...: one relaybench connect run, kept as NAME.json.
  connect() {
    local name=$1
    shift
    bin/relaybench connect --json --workers "${CONNECT_WORKERS:-8}" --duration "${DURATION}s" "$@" >"$out/$name.json" ||
      echo "bench: $name: relaybench connect exited $? (see $out/$name.json)" >&2
  }
  for run in $(seq "$RUNS"); do
    connect "s8-conn-plain-$run" --addr "$cp_addr" --server-pid "$cp_relay"
    connect "s8-conn-full-$run" --addr "$ct_addr" --server-pid "$ct_relay" "${client_tls[@]}"
    connect "s8-conn-resumed-$run" --addr "$ct_addr" --server-pid "$ct_relay" --resume "${client_tls[@]}"
  done
  stop "$cp_relay"
  stop "$ct_relay"
}

# tls_report appends scenario 8's tables to the report.
tls_report() {
  {
    echo
    echo "| 8 TLS, in the same run | client port | answers/s | p50 ms | p99 ms | relay CPU µs/answer | other server CPU µs/answer | load tool CPU µs/answer | errors |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for d in 1 16; do
      for s in plain tls; do
        f=("$out"/s8-ff-$s-d$d-*.json)
        echo "| fast-fail, $CONNS_FASTFAIL conns, depth $d | $s | $(agg %.0f .throughput "${f[@]}") | $(agg %.2f '.latency_us.p50/1000' "${f[@]}") | $(agg %.2f '.latency_us.p99/1000' "${f[@]}") | $(agg %.2f '.server_cpu[0].us_per_answer' "${f[@]}") | | $(agg %.1f '.client_cpu.us_per_answer' "${f[@]}") | $(errors "${f[@]}") |"
      done
    done
    declare -A label=(
      [plain]="plain, target http" [client]="TLS, target http" [both]="TLS, target https with client certificate"
      [conn-plain]="plain TCP" [conn-full]="mutual TLS, full handshakes" [conn-resumed]="mutual TLS, resumed sessions"
    )
    for s in plain client both; do
      f=("$out"/s8-full-$s-*.json)
      echo "| full path, 64 conns | ${label[$s]} | $(agg %.0f .throughput "${f[@]}") | $(agg %.2f '.latency_us.p50/1000' "${f[@]}") | $(agg %.2f '.latency_us.p99/1000' "${f[@]}") | $(agg %.1f '.server_cpu[0].us_per_answer' "${f[@]}") | fixture $(agg %.1f '.server_cpu[1].us_per_answer' "${f[@]}") | $(agg %.1f '.client_cpu.us_per_answer' "${f[@]}") | $(errors "${f[@]}") |"
    done
    echo
    echo "| memory, $IDLE_CONNS idle mutual-TLS connections | KiB per connection | relay RSS held, MiB | lost |"
    echo "| --- | ---: | ---: | ---: |"
    for mode in cold warm; do
      f=("$out"/s8-idle-$mode-*.json)
      echo "| $mode | $(agg %.2f .kib_per_conn "${f[@]}") | $(agg %.1f '.rss_held_kib/1024' "${f[@]}") | $(jq -s 'map(.lost + .dial_errors) | add' "${f[@]}") |"
    done
    echo
    echo "| connections: connect, handshake, one E903, close; ${CONNECT_WORKERS:-8} at a time | per second | p50 ms | p99 ms | relay CPU µs per connection | load tool CPU µs per connection | resumed | failed |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for s in plain full resumed; do
      f=("$out"/s8-conn-$s-*.json)
      echo "| ${label[conn-$s]} | $(agg %.0f .per_second "${f[@]}") | $(agg %.2f '.latency_us.p50/1000' "${f[@]}") | $(agg %.2f '.latency_us.p99/1000' "${f[@]}") | $(agg %.0f '.server_cpu[0].us_per_answer' "${f[@]}") | $(agg %.0f '.client_cpu.us_per_answer' "${f[@]}") | $(agg %.1f%% '100 * .resumed / ([.connections, 1] | max)' "${f[@]}") | $(jq -s 'map(.failures) | add' "${f[@]}") |"
    done
  } >>"$out/table.md"
}

# ------------------------------------------- 9. full path vs HAProxy --

# wait_port ADDR PID LOG: waits up to 10 s for process PID to listen on
# ADDR; gives up with the end of LOG if PID ends first.
wait_port() {
  for _ in $(seq 200); do
    (exec 9<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null && return
    kill -0 "$2" 2>/dev/null || die "pid $2 ended before listening on $1: $(tail -n 3 "$3")"
    sleep 0.05
  done
  die "nothing listens on $1 after 10 s: $(tail -n 3 "$3")"
}

# proxy_bench runs scenario 9: one raw target, the hub and HAProxy in
# front of it, and the same load through the hub (its line protocol),
# through HAProxy and straight to the target (HTTP), in turn, RUNS rounds
# at 16 and 64 connections.
proxy_bench() {
  need_cmd haproxy haproxy
  echo "bench: 9. full path: hub vs HAProxy vs straight to a raw target" >&2
  bin/relaybench target --listen 127.0.0.1:0 2>"$out/raw-target.log" &
  local target=$! target_addr
  pids+=("$target")
  target_addr=$(wait_addr "$out/raw-target.log")
  start_relay proxy --target "CORE=http://$target_addr" --max-inflight "$FULL_INFLIGHT"
  local relay=$HUB_PID relay_addr=$HUB_ADDR base="" base_addr=""
  if [[ -n $BASE_RELAY ]]; then
    HUB_BIN=$BASE_RELAY start_relay proxy-base --target "CORE=http://$target_addr" --max-inflight "$FULL_INFLIGHT"
    base=$HUB_PID base_addr=$HUB_ADDR
  fi
  # HAProxy as a keep-alive HTTP proxy with the hub's timeouts: 3 s to the
  # target, 5 min idle on the client side. nbthread defaults to the CPUs, as
  # GOMAXPROCS does for the hub.
  local ha_addr="127.0.0.1:$(free_port)"
  cat >"$out/haproxy.cfg" <<CFG
global
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 3s
    timeout client 5m
    timeout server 3s
    timeout http-keep-alive 5m
frontend bench
    bind $ha_addr
    default_backend core
backend core
    server core $target_addr maxconn $FULL_INFLIGHT
CFG
  haproxy -db -f "$out/haproxy.cfg" >"$out/haproxy.log" 2>&1 &
  local ha=$!
  pids+=("$ha")
  wait_port "$ha_addr" "$ha" "$out/haproxy.log"
  answer=$(bin/relayctl send --addr "$relay_addr" CORE "BAL ACC1" || true)
  [[ $answer == *"|0000|"* ]] || die "the hub does not answer 0000 through the raw target: $answer"
  if [[ -n $base ]]; then
    answer=$(bin/relayctl send --addr "$base_addr" CORE "BAL ACC1" || true)
    [[ $answer == *"|0000|"* ]] || die "$BASE_RELAY does not answer 0000 through the raw target: $answer"
  fi
  local run c
  for run in $(seq "$RUNS"); do
    for c in 16 64; do
      io_load hub "$c" "$run" "$relay" --addr "$relay_addr" --conns "$c" --payload 'BAL ACC{conn}' \
        --server-pid "$relay" --server-pid "$target"
      if [[ -n $base ]]; then
        io_load base "$c" "$run" "$base" --addr "$base_addr" --conns "$c" --payload 'BAL ACC{conn}' \
          --server-pid "$base" --server-pid "$target"
        proxy_pair "s9-pair-hub-base-c$c-$run" "$out/s9-hub-c$c-$run.json" "$out/s9-base-c$c-$run.json"
      fi
      load "s9-haproxy-c$c-$run" --addr "$ha_addr" --protocol http --conns "$c" --payload 'BAL ACC{conn}' \
        --server-pid "$ha" --server-pid "$target"
      load "s9-direct-c$c-$run" --addr "$target_addr" --protocol http --conns "$c" --payload 'BAL ACC{conn}' \
        --server-pid "$target"
      proxy_pair "s9-pair-hub-haproxy-c$c-$run" "$out/s9-hub-c$c-$run.json" "$out/s9-haproxy-c$c-$run.json"
      proxy_pair "s9-pair-hub-direct-c$c-$run" "$out/s9-hub-c$c-$run.json" "$out/s9-direct-c$c-$run.json"
      proxy_pair "s9-pair-haproxy-direct-c$c-$run" "$out/s9-haproxy-c$c-$run.json" "$out/s9-direct-c$c-$run.json"
    done
  done
  if ((STRACE)); then
    need_cmd strace strace
    strace_count hub "$relay" --addr "$relay_addr"
    [[ -z $base ]] || strace_count base "$base" --addr "$base_addr"
    strace_count haproxy "$ha" --addr "$ha_addr" --protocol http
  fi
  stop "$ha"
  [[ -z $base ]] || stop "$base"
  stop "$relay"
  stop "$target"
}

# ------------------------------------------ 10. duplicate-TXID shield --

# dedup_bench runs scenario 10. Every line of the load has a TXID of its
# own, so the shield claims and settles each one: the cost on the path of
# every shielded request. The load tool's TXIDs repeat from run to run, so
# each run gets a fresh relay (and an empty Redis), else the shield would
# answer the second run from memory.
dedup_bench() {
  echo "bench: 10. the duplicate-TXID shield: off, local, fleet" >&2
  bin/relaybench target --listen 127.0.0.1:0 2>"$out/s10-target.log" &
  local target=$! target_addr run c side answer args
  pids+=("$target")
  target_addr=$(wait_addr "$out/s10-target.log")
  start_redis
  for run in $(seq "$RUNS"); do
    for c in 16 64; do
      for side in off local fleet; do
        args=(--target "CORE=http://$target_addr" --max-inflight "$FULL_INFLIGHT")
        case $side in
        local) args+=(--dedup) ;;
        fleet)
          redis-cli -h 127.0.0.1 -p "${REDIS_ADDR##*:}" flushall >/dev/null
          args+=(--dedup --state-store "redis://$REDIS_ADDR/0" --hub-id bench-dedup)
          ;;
        esac
        start_relay "s10-$side" "${args[@]}"
        answer=$(bin/relayctl send --addr "$HUB_ADDR" CORE "BAL ACC1" || true)
        [[ $answer == *"|0000|"* ]] || die "the shielded ($side) relay does not answer 0000: $answer"
        load "s10-$side-c$c-$run" --addr "$HUB_ADDR" --conns "$c" --payload 'BAL ACC{conn}' \
          --server-pid "$HUB_PID" --server-pid "$target" --server-pid "$REDIS_PID"
        stop "$HUB_PID"
      done
      dedup_pair "s10-pair-local-c$c-$run" "$out/s10-local-c$c-$run.json" "$out/s10-off-c$c-$run.json"
      dedup_pair "s10-pair-fleet-c$c-$run" "$out/s10-fleet-c$c-$run.json" "$out/s10-off-c$c-$run.json"
    done
  done
  stop "$REDIS_PID"
  stop "$target"
}

# ------------------------------------------------- 11. the adaptive limit --

# adaptive_bench runs scenario 11: in each round a static hub at
# ADAPT_LIMIT, a static one at twice that, and an adaptive one under that
# ceiling, each with a fresh fixture, s11-SIDE-RUN.json.
adaptive_bench() {
  local r side
  adapt_rate=$((ADAPT_WORKERS * 1000 * 9 / (ADAPT_SERVICE_MS * 10)))
  for r in $(seq "$RUNS"); do
    for side in static static2x adaptive; do
      case $side in
      static) adaptive_run "$side" "$r" --max-inflight "$ADAPT_LIMIT" ;;
      static2x) adaptive_run "$side" "$r" --max-inflight $((2 * ADAPT_LIMIT)) ;;
      adaptive) adaptive_run "$side" "$r" --max-inflight $((2 * ADAPT_LIMIT)) --adaptive-limit on ;;
      esac
    done
  done
}

# adaptive_run SIDE RUN RELAY-ARGS...: one hub of scenario 11 through the
# three phases; the fixture's workers are cut and restored on the clock of
# the load, started at the same moment.
adaptive_run() {
  local side=$1 r=$2 admin ctl
  shift 2
  start_fixture "s11-$side-$r" core --capacity "$ADAPT_WORKERS" --service-ms "$ADAPT_SERVICE_MS"
  local fix=$FIX_PID url=$FIX_URL
  start_relay "s11-$side-$r" --target "CORE=$url" --target-timeout "$ADAPT_TIMEOUT" --fail-threshold 1000000 "$@"
  admin=$(wait_field "$out/relay-s11-$side-$r.log" admin_addr)
  (
    sleep "$ADAPT_HEALTHY"
    curl -sf -XPOST "$url/_ctl" -d "{\"capacity\":$((ADAPT_WORKERS / 2))}" >/dev/null
    sleep "$ADAPT_DEGRADED"
    curl -sf -XPOST "$url/_ctl" -d "{\"capacity\":$ADAPT_WORKERS}" >/dev/null
  ) &
  ctl=$!
  pids+=("$ctl")
  bin/relaybench load --quiet --json --addr "$HUB_ADDR" --conns "$ADAPT_CONNS" --rate "$adapt_rate" \
    --duration "$((ADAPT_HEALTHY + ADAPT_DEGRADED + ADAPT_RESTORED))s" --drain 2s \
    --phase "healthy=${ADAPT_HEALTHY}s" --phase "degraded=${ADAPT_DEGRADED}s" --phase "restored=${ADAPT_RESTORED}s" \
    --watch-url "http://$admin/metrics" --watch-series 'relay_bulkhead_limit{target="CORE"}' >"$out/s11-$side-$r.json" ||
    echo "bench: s11-$side-$r: relaybench load exited $? (see $out/s11-$side-$r.json)" >&2
  wait "$ctl" || echo "bench: s11-$side-$r: the fixture's capacity could not be changed" >&2
  forget "$ctl"
  stop "$HUB_PID"
  stop "$fix"
}

# adaptive_report prints scenario 11's table: per side and phase, medians
# (min–max) over the rounds.
adaptive_report() {
  local side phase f
  {
    echo
    echo "| 11 adaptive limit: $ADAPT_WORKERS workers × ${ADAPT_SERVICE_MS} ms halved, $adapt_rate/s open loop, timeout $ADAPT_TIMEOUT | phase | 0000/s | p50 ms | p99 ms | E905 % | E901 | limit (settled) | limit settled after s | E905 < 1 % after s |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for side in static static2x adaptive; do
      f=("$out"/s11-"$side"-*.json)
      for phase in healthy degraded restored; do
        local p=".phases[] | select(.name == \"$phase\")"
        echo "| ${adapt_label[$side]} | $phase | $(agg %.0f "$p | .goodput" "${f[@]}") | $(agg %.1f "$p | .latency_us.p50/1000" "${f[@]}") | $(agg %.1f "$p | .latency_us.p99/1000" "${f[@]}") | $(agg %.2f "$p | 100 * (.codes[\"E905\"] // 0) / ([.answered, 1] | max)" "${f[@]}") | $(agg %.0f "$p | .codes[\"E901\"] // 0" "${f[@]}") | $(agg %.0f "$p | .watch.settled // 0" "${f[@]}") | $(agg %.0f "$p | .watch.settle_seconds // 0" "${f[@]}") | $(agg %.0f "$p | .e905_clear_seconds // 999" "${f[@]}") |"
      done
    done
    echo
    echo "Scenario 11: E905 < 1 % after 999 means not within the phase. CPU the machine spent busy, all processes: $(agg %.2f .machine_busy_cores "$out"/s11-*.json) cores of $(nproc)."
  } >>"$out/table.md"
}

# adaptive_verdicts judges the adaptive hub of scenario 11 against the
# static one at ADAPT_LIMIT, on medians over the rounds.
adaptive_verdicts() {
  local a=("$out"/s11-adaptive-*.json) s=("$out"/s11-static-*.json) d='.phases[] | select(.name == "degraded")'
  local cap=$((ADAPT_WORKERS * 1000 / (2 * ADAPT_SERVICE_MS))) g e901a e901s p99a p99s clear healthy
  g=$(med "$d | .goodput" "${a[@]}")
  verdict "adaptive: goodput while degraded ≥ 0.8 × degraded capacity ($cap/s): $(fmt %.0f "$g")/s" "$(ge "$g" "$(awk -v c="$cap" 'BEGIN { print 0.8 * c }')")"
  e901a=$(med '[.phases[].codes["E901"] // 0] | add' "${a[@]}")
  e901s=$(med '[.phases[].codes["E901"] // 0] | add' "${s[@]}")
  verdict "adaptive: E901 no more than static $ADAPT_LIMIT: $e901a against $e901s" "$(le "$e901a" "$e901s")"
  p99a=$(med "$d | .latency_us.p99/1000" "${a[@]}")
  p99s=$(med "$d | .latency_us.p99/1000" "${s[@]}")
  verdict "adaptive: p99 while degraded ≤ ½ static $ADAPT_LIMIT's: $(fmt %.1f "$p99a") ms against $(fmt %.1f "$p99s") ms" "$(le "$p99a" "$(awk -v p="$p99s" 'BEGIN { print p / 2 }')")"
  clear=$(med '.phases[] | select(.name == "restored") | .e905_clear_seconds // 999' "${a[@]}")
  verdict "adaptive: E905 under 1 % within 10 s of the restore: after $clear s" "$(le "$clear" 10)"
  healthy=$(med '.phases[] | select(.name == "healthy") | 100 * (.codes["E905"] // 0) / ([.answered, 1] | max)' "${a[@]}")
  verdict "adaptive: E905 < 0.5 % while healthy: $(fmt %.3f "$healthy") %" "$(lt "$healthy" 0.5)"
}
declare -A adapt_label=([static]="static $ADAPT_LIMIT" [static2x]="static $((2 * ADAPT_LIMIT))" [adaptive]="adaptive, ceiling $((2 * ADAPT_LIMIT))")

# dedup_pair NAME A.json B.json: one round's comparison of two sides of
# scenario 10: replies/s, and the CPU per transaction of relay, target and
# Redis together.
dedup_pair() {
  jq -n --slurpfile a "$2" --slurpfile b "$3" '
    def cpu(r): r.server_cpu | map(.us_per_answer) | add;
    {ratio: ($a[0].throughput / $b[0].throughput), cpu_ratio: (cpu($a[0]) / cpu($b[0])),
     cpu_a: cpu($a[0]), cpu_b: cpu($b[0])}' >"$out/$1.json"
}

# io_load SIDE CONNS RUN PID LOAD-ARGS...: the load run s9-SIDE-cCONNS-RUN,
# and the read(2) and write(2) syscalls process PID made during it per
# transaction answered, from /proc/PID/io (syscr, syscw: every thread's,
# EAGAIN included; recvfrom and sendto are not counted there), in
# s9io-SIDE-cCONNS-RUN.json. Unlike strace, this does not slow the
# syscalls, so it counts the reads that find nothing as often as they
# happen at full speed.
io_load() {
  local side=$1 c=$2 run=$3 pid=$4 r0 w0 r1 w1
  shift 4
  read -r r0 w0 < <(io_counts "$pid")
  load "s9-$side-c$c-$run" "$@"
  read -r r1 w1 < <(io_counts "$pid")
  jq -n --argjson r $((r1 - r0)) --argjson w $((w1 - w0)) --slurpfile l "$out/s9-$side-c$c-$run.json" \
    '{reads: ($r / $l[0].answered), writes: ($w / $l[0].answered)}' >"$out/s9io-$side-c$c-$run.json"
}

# io_counts PID: the read(2) and write(2) syscalls process PID has made.
io_counts() { awk '/^syscr:/ { r = $2 } /^syscw:/ { w = $2 } END { print r, w }' "/proc/$1/io"; }

# proxy_pair NAME A.json B.json: one round's comparison of two sides of
# scenario 9: replies/s, and the CPU per transaction of every server the
# run measured (the target included) and of the first alone.
proxy_pair() {
  jq -n --slurpfile a "$2" --slurpfile b "$3" '
    def cpu: .server_cpu | map(.us_per_answer) | add;
    {
      ratio: ($a[0].throughput / $b[0].throughput),
      cpu_ratio: (($a[0] | cpu) / ($b[0] | cpu)),
      first_cpu_ratio: ($a[0].server_cpu[0].us_per_answer / $b[0].server_cpu[0].us_per_answer)
    }' >"$out/$1.json"
}

# strace_count NAME PID LOAD-ARGS...: the syscalls of process PID, all its
# threads, while a 16-connection closed loop of STRACE_SECONDS runs
# through it; strace is attached before the load starts and detached after
# its last answer, so every transaction counted was in the window. Keeps
# strace's table in s9-strace-NAME.txt and the load's in
# s9-strace-NAME.json.
strace_count() {
  local name=$1 pid=$2
  shift 2
  strace -c -f -p "$pid" -o "$out/s9-strace-$name.txt" 2>"$out/s9-strace-$name.log" &
  local tracer=$!
  pids+=("$tracer")
  local _ t traced
  for _ in $(seq 200); do # until strace has attached to every thread
    traced=1
    for t in /proc/"$pid"/task/*/status; do
      [[ $(awk '/^TracerPid:/ { print $2 }' "$t" 2>/dev/null) == "${tracer:-0}" ]] || traced=0
    done
    ((traced)) && break
    sleep 0.05
  done
  ((traced)) || die "strace did not attach to $name (pid $pid)"
  bin/relaybench load --quiet --json --duration "${STRACE_SECONDS}s" --drain 2s --conns 16 \
    --payload 'BAL ACC{conn}' "$@" >"$out/s9-strace-$name.json" ||
    echo "bench: strace $name: relaybench load exited $?" >&2
  kill -INT "$tracer" 2>/dev/null || true
  wait "$tracer" 2>/dev/null || true
  forget "$tracer"
}

# proxy_report appends scenario 9's table, and with STRACE=1 the syscalls
# per transaction, to the report.
proxy_report() {
  local c s f proxy tcpu sides=(hub) pairs=(hub-haproxy hub-direct haproxy-direct)
  declare -A label=([hub]="hub → raw target" [base]="$BASE_LABEL hub → raw target" [haproxy]="HAProxy → raw target" [direct]="straight to raw target")
  declare -A pairname=([hub-haproxy]="hub ÷ HAProxy" [hub-direct]="hub ÷ direct" [haproxy-direct]="HAProxy ÷ direct" [hub-base]="hub ÷ $BASE_LABEL hub")
  if [[ -n $BASE_RELAY ]]; then
    sides+=(base)
    pairs=(hub-base "${pairs[@]}")
  fi
  sides+=(haproxy direct)
  {
    echo
    echo "| 9 full path, same raw target, in the same run | path | replies/s | p50 ms | p99 ms | proxy CPU µs/transaction | target CPU µs/transaction | server CPU µs/transaction, target included | load tool CPU µs/answer | errors |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for c in 16 64; do
      for s in "${sides[@]}"; do
        f=("$out"/s9-$s-c$c-*.json)
        if [[ $s == direct ]]; then
          proxy="" tcpu='.server_cpu[0].us_per_answer'
        else
          proxy=$(agg %.1f '.server_cpu[0].us_per_answer' "${f[@]}") tcpu='.server_cpu[1].us_per_answer'
        fi
        echo "| $c conns, closed loop | ${label[$s]} | $(agg %.0f .throughput "${f[@]}") | $(agg %.2f '.latency_us.p50/1000' "${f[@]}") | $(agg %.2f '.latency_us.p99/1000' "${f[@]}") | $proxy | $(agg %.1f "$tcpu" "${f[@]}") | $(agg %.1f '.server_cpu | map(.us_per_answer) | add' "${f[@]}") | $(agg %.1f '.client_cpu.us_per_answer' "${f[@]}") | $(errors "${f[@]}") |"
      done
    done
    echo
    echo "| 9 ratios, per round (median (min–max) of $RUNS) | replies/s | server CPU per transaction, target included | proxy's own CPU per transaction |"
    echo "| --- | ---: | ---: | ---: |"
    for c in 16 64; do
      for s in "${pairs[@]}"; do
        f=("$out"/s9-pair-$s-c$c-*.json)
        echo "| $c conns, ${pairname[$s]} | $(agg %.2f .ratio "${f[@]}") | $(agg %.2f .cpu_ratio "${f[@]}") | $([[ $s == *direct ]] || agg %.2f .first_cpu_ratio "${f[@]}") |"
      done
    done
    echo
    echo "| 9 read(2) and write(2) per transaction, at full speed (/proc/PID/io; median (min–max) of $RUNS) | read, EAGAIN included | write |"
    echo "| --- | ---: | ---: |"
    for c in 16 64; do
      for s in hub base; do
        [[ $s == base && -z $BASE_RELAY ]] && continue
        f=("$out"/s9io-$s-c$c-*.json)
        echo "| $c conns, ${label[$s]} | $(agg %.2f .reads "${f[@]}") | $(agg %.2f .writes "${f[@]}") |"
      done
    done
    if ((STRACE)); then
      local traced=(hub) head="hub" rule="---:" counts=() files=()
      [[ -z $BASE_RELAY ]] || traced+=(base)
      traced+=(haproxy)
      for s in "${traced[@]:1}"; do
        [[ $s == base ]] && head+=" | $BASE_LABEL hub" || head+=" | HAProxy"
        rule+=" | ---:"
      done
      for s in "${traced[@]}"; do
        counts+=("$(jq .answered "$out/s9-strace-$s.json")")
        files+=("$out/s9-strace-$s.txt")
      done
      echo
      echo "| 9 syscalls per transaction (strace -c -f, 16 conns, ${STRACE_SECONDS}s; failed: mostly EAGAIN) | $head |"
      echo "| --- | $rule |"
      awk -v counts="${counts[*]}" '
        BEGIN { sides = split(counts, tx, " ") }
        FNR == 1 { side++ }
        $1 ~ /^[0-9]+\.[0-9]+$/ && NF >= 5 {
          name = $NF; n[name, side] = $4; e[name, side] = (NF == 6) ? $5 : 0
          if (name != "total" && !(name in seen)) { seen[name] = 1; order[++k] = name }
        }
        function cell(name, s,   c, x) {
          c = n[name, s] / tx[s]; x = e[name, s] / tx[s]
          if (n[name, s] == 0) return "–"
          return (x >= 0.005) ? sprintf("%.2f (%.2f failed)", c, x) : sprintf("%.2f", c)
        }
        function line(title, name, bold,   s, out, v) {
          out = "| " title
          for (s = 1; s <= sides; s++) { v = cell(name, s); out = out " | " (bold ? "**" v "**" : v) }
          print out " |"
        }
        END {
          for (i = 1; i <= k; i++) {
            show = 0
            for (s = 1; s <= sides; s++) if (n[order[i], s] / tx[s] >= 0.01) show = 1
            if (show) line(order[i], order[i], 0)
          }
          line("**all**", "total", 1)
          out = "| transactions answered in the window"
          for (s = 1; s <= sides; s++) out = out " | " tx[s]
          print out " |"
        }' "${files[@]}"
    fi
  } >>"$out/table.md"
}

# open_report appends scenario 3b's tables: CLAIM alone and during the
# open-CORE storm, per relay; the ratios per round; the storm itself.
open_report() {
  local side f
  {
    echo
    echo "| 3b isolation, CORE open, CLAIM $CLAIM_CONNS conns at $CLAIM_RATE/s | relay | CLAIM answers/s | CLAIM p50 ms (0000) | CLAIM p99 ms (0000) | CLAIM E905 | errors |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    for side in "${io_sides[@]}"; do
      for s in alone during; do
        f=("$out"/s3b-$side-$s-*.json)
        echo "| $([[ $s == alone ]] && echo "CLAIM alone" || echo "during $STORM_CONNS conns flat out on open CORE") | $side | $(agg %.0f .throughput "${f[@]}") | $(agg %.2f '.latency_ok_us.p50/1000' "${f[@]}") | $(agg %.2f '.latency_ok_us.p99/1000' "${f[@]}") | $(jq -s 'map(.codes["E905"] // 0) | add' "${f[@]}") ($(share E905 "${f[@]}" | awk '{ printf "%.2f%%", $1 }')) | $(errors "${f[@]}") |"
      done
    done
    echo
    echo "| 3b per round, median (min–max) of $RUNS | relay | CLAIM p99 during ÷ alone | CLAIM p50 during ÷ alone | storm E904/s | storm p99 ms | storm relay CPU µs/answer |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    for side in "${io_sides[@]}"; do
      f=("$out"/s3b-$side-storm-*.json)
      echo "| CORE open, $STORM_CONNS conns flat out | $side | $(agg %.2f .ok_p99_ratio "$out"/s3b-$side-pair-*.json) | $(agg %.2f .ok_p50_ratio "$out"/s3b-$side-pair-*.json) | $(agg %.0f '.codes["E904"] / .elapsed_seconds' "${f[@]}") | $(agg %.2f '.latency_us.p99/1000' "${f[@]}") | $(agg %.2f '.server_cpu[0].us_per_answer' "${f[@]}") |"
    done
    if [[ -n $BEFORE_RELAY ]]; then
      echo
      echo "Storm answers/s, after ÷ before, per round: $(agg %.2f .ratio "$out"/s3b-storm-pair-*.json); relay CPU per storm answer, after ÷ before: $(agg %.2f .cpu_ratio "$out"/s3b-storm-pair-*.json)."
    fi
  } >>"$out/table.md"
}

# ------------------------------------------------------------ aggregation --

# agg FMT JQ FILE...: median (min–max) of JQ over the files, each printed
# with the printf format FMT.
agg() {
  local fmt=$1 expr=$2
  shift 2
  jq -r "$expr" "$@" | sort -g | awk -v f="$fmt" '
    { v[NR] = $1 }
    END {
      if (NR == 0) { print "n/a"; exit }
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf f " (" f "–" f ")\n", m, v[1], v[NR]
    }'
}

# med JQ FILE...: the median of JQ over the files, unformatted.
med() {
  local expr=$1
  shift
  jq -r "$expr" "$@" | sort -g | awk '
    { v[NR] = $1 }
    END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# pair NAME A.json B.json: the per-run comparison of two alternating runs.
pair() {
  jq -n --slurpfile a "$2" --slurpfile b "$3" '{
    ratio: ($a[0].throughput / $b[0].throughput),
    p99_ratio: ($a[0].latency_us.p99 / $b[0].latency_us.p99),
    p99_overhead_us: ($a[0].latency_us.p99 - $b[0].latency_us.p99),
    ok_p99_ratio: (if $b[0].latency_ok_us.p99 > 0 then $a[0].latency_ok_us.p99 / $b[0].latency_ok_us.p99 else null end),
    ok_p50_ratio: (if $b[0].latency_ok_us.p50 > 0 then $a[0].latency_ok_us.p50 / $b[0].latency_ok_us.p50 else null end),
    cpu_ratio: (if ($b[0].server_cpu // [] | length) > 0 and $b[0].server_cpu[0].us_per_answer > 0
                then $a[0].server_cpu[0].us_per_answer / $b[0].server_cpu[0].us_per_answer else null end)
  }' >"$out/$1.json"
}

# errors FILE...: unmatched+missing+malformed+connection errors, summed.
errors() { jq -s 'map(.unmatched + .missing + .malformed + .conn_errors) | add' "$@"; }

# share CODE FILE...: the percentage of answers with CODE over the files.
share() {
  jq -rs --arg c "$1" 'map(.codes[$c] // 0) as $n | map(.answered) as $a |
    if ($a | add) > 0 then (100 * ($n | add) / ($a | add)) else 0 end' "${@:2}"
}

# row CELL...: appends one row to the table.
row() {
  local IFS='|'
  local s="$*"
  echo "| ${s//|/ | } |" >>"$out/table.md"
}

# load_row SCENARIO SERVER NOTE FILE...: the row of a load measured in
# FILE...: answers/s, p50, p99, the first server's and the load tool's CPU
# per answer, and the errors, followed by NOTE.
load_row() {
  local scenario=$1 server=$2 note=$3
  shift 3
  row "$scenario" "$server" \
    "$(agg %.0f .throughput "$@")" \
    "$(agg %.2f '.latency_us.p50/1000' "$@")" \
    "$(agg %.2f '.latency_us.p99/1000' "$@")" \
    "$(agg %.2f '.server_cpu[0].us_per_answer' "$@")" \
    "$(agg %.1f '.client_cpu.us_per_answer' "$@")" \
    "$(errors "$@")$note"
}

# start_table: the table's header, in a new table.md.
start_table() {
  : >"$out/table.md"
  row "scenario" "server" "answers/s" "p50 ms" "p99 ms" "server CPU µs/answer" "load tool CPU µs/answer" "errors"
  row "---" "---" "---:" "---:" "---:" "---:" "---:" "---:"
}

# end_table: appends the targets of the performance record to the table,
# and prints it.
end_table() {
  {
    echo
    echo "Targets:"
    printf '  %s\n' "${targets[@]}"
  } >>"$out/table.md"
  echo
  cat "$out/table.md"
}

targets=()
verdict() { # TEXT OK(1/0)
  if (($2)); then targets+=("MET      $1"); else targets+=("NOT MET  $1"); fi
}
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }' && echo 1 || echo 0; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }' && echo 1 || echo 0; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }' && echo 1 || echo 0; }
fmt() { awk -v f="$1" -v v="$2" 'BEGIN { printf f, v }'; }

echo "bench: results in $out; $RUNS runs of ${DURATION}s per measurement" >&2

# ------------------------------------- 7. the status page on and off --
# The full run calls it after scenario 6 (SCENARIOS=7 runs it alone).

# page_bench: scenario 7's runs, s7-*.json: each relay of a pair started
# alike but for --no-status-page, both serving throughout.
page_bench() {
  echo "bench: 7. the status page on and off" >&2
  start_fixture CORE core
  local fix=$FIX_PID url=$FIX_URL closed side admin run
  local -A full_addr full_pid ff_addr ff_pid
  closed=$(free_port)
  for side in on off; do
    local flag=()
    [[ $side == off ]] && flag=(--no-status-page)
    start_relay "page-full-$side" --target "CORE=$url" --max-inflight "$FULL_INFLIGHT" "${flag[@]}"
    full_addr[$side]=$HUB_ADDR full_pid[$side]=$HUB_PID
    start_relay "page-ff-$side" --target "CORE=http://127.0.0.1:$closed" --fail-threshold 1 --reset-timeout 1h "${flag[@]}"
    ff_addr[$side]=$HUB_ADDR ff_pid[$side]=$HUB_PID
    # The one call that trips the breaker: refused by the closed port.
    bin/relayctl send --addr "$HUB_ADDR" CORE "BAL ACC1" >/dev/null || true
  done
  # A browser watching each page-on relay: its stream of updates open, read
  # and dropped, for the whole scenario.
  for name in page-full-on page-ff-on; do
    admin=$(grep -o '"admin_addr":"[^"]*"' "$out/relay-$name.log" | head -n 1 | cut -d'"' -f4)
    curl -sfN "http://$admin/events" >/dev/null &
    pids+=("$!")
  done
  for run in $(seq "$RUNS"); do
    for side in on off; do
      load "s7-full-$side-$run" --addr "${full_addr[$side]}" --conns 64 --payload 'BAL ACC{conn}' \
        --server-pid "${full_pid[$side]}" --server-pid "$fix"
      load "s7-ff-$side-$run" --addr "${ff_addr[$side]}" --conns 64 --depth 16 --server-pid "${ff_pid[$side]}"
    done
    pair "s7-pair-full-$run" "$out/s7-full-on-$run.json" "$out/s7-full-off-$run.json"
    pair "s7-pair-ff-$run" "$out/s7-ff-on-$run.json" "$out/s7-ff-off-$run.json"
  done
  for side in on off; do
    stop "${full_pid[$side]}"
    stop "${ff_pid[$side]}"
  done
  stop "$fix"
}

# page_report: scenario 7's rows of the table, and its targets: with the
# page on and watched, relay CPU per answer within 5 % of off (the steady
# figure; answers/s moves by tens of percent from run to run here, and is
# reported beside it).
page_report() {
  local m label r c
  for m in full ff; do
    case $m in
    full) label="7 status page, full path, 64 conns" ;;
    ff) label="7 status page, fast-fail, 64 conns, depth 16" ;;
    esac
    load_row "$label" "page on, a browser watching" "" "$out"/s7-$m-on-*.json
    load_row "$label" "page off" "" "$out"/s7-$m-off-*.json
    r=$(med .ratio "$out"/s7-pair-$m-*.json)
    c=$(med .cpu_ratio "$out"/s7-pair-$m-*.json)
    verdict "status page ($m): relay CPU per answer on/off ≤ 1.05×: $(fmt %.2f "$c")× (answers/s $(fmt %.2f "$r")×)" "$(le "$c" 1.05)"
  done
}


# ------------------------------------------------- 1. fast-fail vs redis --

if want 1; then
echo "bench: 1. fast-fail vs redis PING" >&2
closed=$(free_port)
start_relay fastfail --target "CORE=http://127.0.0.1:$closed" --fail-threshold 1 --reset-timeout 1h
ff_relay=$HUB_PID ff_addr=$HUB_ADDR
trip_core "$ff_addr"
if [[ -n $BEFORE_RELAY ]]; then
  HUB_BIN=$BEFORE_RELAY start_relay fastfail-before --target "CORE=http://127.0.0.1:$closed" --fail-threshold 1 --reset-timeout 1h
  fb_relay=$HUB_PID fb_addr=$HUB_ADDR
  trip_core "$fb_addr"
fi
start_redis
for run in $(seq "$RUNS"); do
  for d in 1 16; do
    load "s1-relay-d$d-$run" --addr "$ff_addr" --conns "$CONNS_FASTFAIL" --depth "$d" --server-pid "$ff_relay"
    if [[ -n $BEFORE_RELAY ]]; then
      load "s1-before-d$d-$run" --addr "$fb_addr" --conns "$CONNS_FASTFAIL" --depth "$d" --server-pid "$fb_relay"
    fi
    load "s1-redis-d$d-$run" --addr "$REDIS_ADDR" --protocol redis-ping --conns "$CONNS_FASTFAIL" --depth "$d" --server-pid "$REDIS_PID"
    pair "s1-pair-d$d-$run" "$out/s1-relay-d$d-$run.json" "$out/s1-redis-d$d-$run.json"
    if [[ -n $BEFORE_RELAY ]]; then
      pair "s1-pairbefore-d$d-$run" "$out/s1-before-d$d-$run.json" "$out/s1-redis-d$d-$run.json"
      pair "s1-pairafter-d$d-$run" "$out/s1-relay-d$d-$run.json" "$out/s1-before-d$d-$run.json"
    fi
  done
done
stop "$ff_relay"
[[ -n $BEFORE_RELAY ]] && stop "$fb_relay"
stop "$REDIS_PID"
fi

# ---------------------------------------------- 2. full path vs direct --

if want 2; then
echo "bench: 2. full path vs straight to the fixture" >&2
start_fixture CORE core
fp_fix=$FIX_PID fp_url=$FIX_URL
start_relay full --target "CORE=$fp_url" --max-inflight "$FULL_INFLIGHT"
fp_relay=$HUB_PID fp_addr=$HUB_ADDR
for run in $(seq "$RUNS"); do
  for c in 16 64; do
    load "s2-relay-c$c-$run" --addr "$fp_addr" --conns "$c" --payload 'BAL ACC{conn}' \
      --server-pid "$fp_relay" --server-pid "$fp_fix"
    load "s2-direct-c$c-$run" --addr "${fp_url#http://}" --protocol http --conns "$c" \
      --payload 'BAL ACC{conn}' --server-pid "$fp_fix"
    pair "s2-pair-c$c-$run" "$out/s2-relay-c$c-$run.json" "$out/s2-direct-c$c-$run.json"
  done
  load "s2-relay-paced-$run" --addr "$fp_addr" --conns 16 --rate "$FULL_RATE" --payload 'BAL ACC{conn}' \
    --server-pid "$fp_relay" --server-pid "$fp_fix"
  load "s2-direct-paced-$run" --addr "${fp_url#http://}" --protocol http --conns 16 --rate "$FULL_RATE" \
    --payload 'BAL ACC{conn}' --server-pid "$fp_fix"
  pair "s2-pair-paced-$run" "$out/s2-relay-paced-$run.json" "$out/s2-direct-paced-$run.json"
done
stop "$fp_relay"
stop "$fp_fix"
fi

# ------------------------------------------------------- 3. isolation --

if want 3a; then
echo "bench: 3. isolation: CLAIM while CORE is slow and hammered" >&2
start_fixture CORE core --mode slow --delay-ms "$SLOW_MS"
is_core=$FIX_PID is_core_url=$FIX_URL
start_fixture CLAIM claim
is_claim=$FIX_PID is_claim_url=$FIX_URL
start_relay isolation --target "CORE=$is_core_url" --target "CLAIM=$is_claim_url"
is_relay=$HUB_PID is_addr=$HUB_ADDR
claim_load() {
  load "$1" --addr "$is_addr" --conns "$CLAIM_CONNS" --rate "$CLAIM_RATE" --mix CLAIM=100 \
    --payload 'SUBMIT P{conn} 100'
}
# storm NAME [ARGS...]: CLAIM measured while STORM_CONNS connections send
# CORE requests, started a second early so the storm is at full strength.
storm() {
  local name=$1
  shift
  bin/relaybench load --quiet --json --addr "$is_addr" --conns "$STORM_CONNS" --mix CORE=100 \
    --duration "$((DURATION + 2))s" --drain 2s --server-pid "$is_relay" "$@" >"$out/s3-storm-$name.json" &
  local storm=$!
  pids+=("$storm")
  sleep 1
  claim_load "s3-during-$name"
  wait "$storm" || echo "bench: storm $name: relaybench load exited $?" >&2
  forget "$storm"
}
for run in $(seq "$RUNS"); do
  claim_load "s3-alone-$run"
  storm "flat-$run"
  storm "paced-$run" --rate "$STORM_RATE"
  pair "s3-pair-flat-$run" "$out/s3-during-flat-$run.json" "$out/s3-alone-$run.json"
  pair "s3-pair-paced-$run" "$out/s3-during-paced-$run.json" "$out/s3-alone-$run.json"
done
stop "$is_relay"
stop "$is_core"
stop "$is_claim"
fi

if want 3b; then
echo "bench: 3b. isolation: CLAIM while CORE is open and hammered" >&2
# The relays under test: this tree's, and BEFORE_RELAY's when set. Each
# has a dead CORE, tripped by one call (E902), and a CLAIM fixture of its
# own, so the two relays share nothing but the machine.
io_sides=(after)
[[ -n $BEFORE_RELAY ]] && io_sides+=(before)
declare -A io_addr io_pid io_claim
closed=$(free_port)
for side in "${io_sides[@]}"; do
  start_fixture "CLAIM-$side" claim
  io_claim[$side]=$FIX_PID
  bin=bin/relay
  [[ $side == before ]] && bin=$BEFORE_RELAY
  HUB_BIN=$bin start_relay "open-$side" --target "CORE=http://127.0.0.1:$closed" --target "CLAIM=$FIX_URL" \
    --fail-threshold 1 --reset-timeout 1h
  io_addr[$side]=$HUB_ADDR io_pid[$side]=$HUB_PID
  trip_core "$HUB_ADDR"
done
# open_claim NAME SIDE: CLAIM's paced load through SIDE's relay.
open_claim() {
  load "$1" --addr "${io_addr[$2]}" --conns "$CLAIM_CONNS" --rate "$CLAIM_RATE" --mix CLAIM=100 \
    --payload 'SUBMIT P{conn} 100'
}
# open_storm SIDE RUN: CLAIM measured while STORM_CONNS connections send
# CORE lines flat out to SIDE's relay, started a second early.
open_storm() {
  bin/relaybench load --quiet --json --addr "${io_addr[$1]}" --conns "$STORM_CONNS" --mix CORE=100 \
    --duration "$((DURATION + 2))s" --drain 2s --server-pid "${io_pid[$1]}" >"$out/s3b-$1-storm-$2.json" &
  local storm=$!
  pids+=("$storm")
  sleep 1
  open_claim "s3b-$1-during-$2" "$1"
  wait "$storm" || echo "bench: open storm $1 $2: relaybench load exited $?" >&2
  forget "$storm"
}
for run in $(seq "$RUNS"); do
  for side in "${io_sides[@]}"; do
    open_claim "s3b-$side-alone-$run" "$side"
    open_storm "$side" "$run"
    pair "s3b-$side-pair-$run" "$out/s3b-$side-during-$run.json" "$out/s3b-$side-alone-$run.json"
  done
  if [[ -n $BEFORE_RELAY ]]; then
    pair "s3b-storm-pair-$run" "$out/s3b-after-storm-$run.json" "$out/s3b-before-storm-$run.json"
  fi
done
for side in "${io_sides[@]}"; do
  stop "${io_pid[$side]}"
  stop "${io_claim[$side]}"
done
fi

# ---------------------------------------------------------- 4. memory --

if want 4; then
echo "bench: 4. memory: $IDLE_CONNS idle connections" >&2
[[ -z $BASE_RELAY || -x $BASE_RELAY ]] || die "BASE_RELAY=$BASE_RELAY is not an executable"
closed=$(free_port)
idle_sides=(relay redis)
[[ -n $BASE_RELAY ]] && idle_sides+=(base)
# idle SIDE MODE RUN: one relaybench idle run against a fresh server.
idle() {
  local side=$1 mode=$2 run=$3 addr pid proto=relay warm=()
  [[ $mode == warm ]] && warm=(--warm)
  case $side in
  relay) start_relay "idle-$mode-$run" --target "CORE=http://127.0.0.1:$closed" ;;
  base) HUB_BIN=$BASE_RELAY start_relay "idle-base-$mode-$run" --target "CORE=http://127.0.0.1:$closed" ;;
  redis) start_redis ;;
  esac
  if [[ $side == redis ]]; then
    addr=$REDIS_ADDR pid=$REDIS_PID proto=redis-ping
  else
    addr=$HUB_ADDR pid=$HUB_PID
  fi
  bin/relaybench idle --json --addr "$addr" --protocol "$proto" --conns "$IDLE_CONNS" --hold "$IDLE_HOLD" "${warm[@]}" \
    --server-pid "$pid" >"$out/s4-$side-$mode-$run.json" ||
    echo "bench: idle $side $mode run $run: relaybench idle exited $?" >&2
  stop "$pid"
}
for run in $(seq "$RUNS"); do
  for mode in cold warm; do
    for side in "${idle_sides[@]}"; do idle "$side" "$mode" "$run"; done
    jq -n --slurpfile a "$out/s4-relay-$mode-$run.json" --slurpfile b "$out/s4-redis-$mode-$run.json" \
      '{ratio: ($a[0].kib_per_conn / $b[0].kib_per_conn)}' >"$out/s4-pair-redis-$mode-$run.json"
    if [[ -n $BASE_RELAY ]]; then
      jq -n --slurpfile a "$out/s4-relay-$mode-$run.json" --slurpfile b "$out/s4-base-$mode-$run.json" \
        '{ratio: ($a[0].kib_per_conn / $b[0].kib_per_conn)}' >"$out/s4-pair-base-$mode-$run.json"
    fi
  done
done
fi

# ------------------------------------------------ 5. micro-benchmarks --

if want 5; then
echo "bench: 5. micro-benchmarks" >&2
go test -run '^$' -bench . -benchmem -count "$RUNS" ./breaker/ ./bulkhead/ >"$out/s5-micro.txt"
if ! go test -run '^$' -bench 'FastFailLine|BulkheadFullLine|CallLine|ParseRequest|AppendResponse' -benchmem \
  -count "$RUNS" ./relay/ >"$out/s5-relay.txt" 2>&1; then
  echo "bench: relay micro-benchmarks did not run (see $out/s5-relay.txt)" >&2
fi
fi

# ------------------------------------------------------- 6. fleet mode --

if want 6; then
echo "bench: 6. fleet mode: --state-store on vs off" >&2
# One Redis, a database for each pair of relays: each pair's CORE is its
# own (a message on the channel, which all databases share, makes a relay
# read its own database and change nothing).
start_redis
closed=$(free_port)
start_relay fleet-ff-off --target "CORE=http://127.0.0.1:$closed" --fail-threshold 1 --reset-timeout 1h
ffo_relay=$HUB_PID ffo_addr=$HUB_ADDR
start_relay fleet-ff-on --target "CORE=http://127.0.0.1:$closed" --fail-threshold 1 --reset-timeout 1h \
  --state-store "redis://$REDIS_ADDR/1" --hub-id bench-ff
ffn_relay=$HUB_PID ffn_addr=$HUB_ADDR
for a in "$ffo_addr" "$ffn_addr"; do
  bin/relayctl send --addr "$a" CORE "BAL ACC1" >/dev/null || true
  answer=$(bin/relayctl send --addr "$a" CORE "BAL ACC1" || true)
  [[ $answer == *"|E904|"* ]] || die "CORE's breaker did not open on $a: $answer"
done
start_fixture CORE core
f6_fix=$FIX_PID f6_url=$FIX_URL
start_relay fleet-full-off --target "CORE=$f6_url" --max-inflight "$FULL_INFLIGHT"
fpo_relay=$HUB_PID fpo_addr=$HUB_ADDR
start_relay fleet-full-on --target "CORE=$f6_url" --max-inflight "$FULL_INFLIGHT" \
  --state-store "redis://$REDIS_ADDR/2" --hub-id bench-full
fpn_relay=$HUB_PID fpn_addr=$HUB_ADDR
for a in "$fpo_addr" "$fpn_addr"; do
  answer=$(bin/relayctl send --addr "$a" CORE "BAL ACC1" || true)
  [[ $answer == *"|0000|"* ]] || die "the full path through $a does not answer 0000: $answer"
done
for run in $(seq "$RUNS"); do
  load "s6-ff-off-$run" --addr "$ffo_addr" --conns "$CONNS_FASTFAIL" --depth 1 --server-pid "$ffo_relay"
  load "s6-ff-on-$run" --addr "$ffn_addr" --conns "$CONNS_FASTFAIL" --depth 1 --server-pid "$ffn_relay"
  pair "s6-pair-ff-$run" "$out/s6-ff-on-$run.json" "$out/s6-ff-off-$run.json"
  load "s6-full-off-$run" --addr "$fpo_addr" --conns 16 --payload 'BAL ACC{conn}' --server-pid "$fpo_relay"
  load "s6-full-on-$run" --addr "$fpn_addr" --conns 16 --payload 'BAL ACC{conn}' --server-pid "$fpn_relay"
  pair "s6-pair-full-$run" "$out/s6-full-on-$run.json" "$out/s6-full-off-$run.json"
  load "s6-paced-off-$run" --addr "$fpo_addr" --conns 16 --rate "$FULL_RATE" --payload 'BAL ACC{conn}' --server-pid "$fpo_relay"
  load "s6-paced-on-$run" --addr "$fpn_addr" --conns 16 --rate "$FULL_RATE" --payload 'BAL ACC{conn}' --server-pid "$fpn_relay"
  pair "s6-pair-paced-$run" "$out/s6-paced-on-$run.json" "$out/s6-paced-off-$run.json"
done
for p in "$ffo_relay" "$ffn_relay" "$fpo_relay" "$fpn_relay" "$f6_fix" "$REDIS_PID"; do stop "$p"; done
# The propagation of a trip from one hub to two others, over 20 trips: the
# integration test, on binaries built without the race detector.
go test -count=1 -v -run '^TestFleetTripReachesEveryHubWithin100ms$' ./cmd/relay/ >"$out/s6-propagation.txt" 2>&1 ||
  echo "bench: the propagation test failed (see $out/s6-propagation.txt)" >&2
fi

want 7 && page_bench

want 8 && tls_bench

want 9 && proxy_bench

want 10 && dedup_bench

want 11 && adaptive_bench

# ------------------------------------------------------------- report --

start_table
want 1 && for d in 1 16; do
  for s in relay before redis; do
    [[ $s == before && -z $BEFORE_RELAY ]] && continue
    label=$s
    [[ $s == before ]] && label="relay before ($BEFORE_RELAY)"
    load_row "1 fast-fail, $CONNS_FASTFAIL conns, depth $d" "$label" "" "$out"/s1-$s-d$d-*.json
  done
done
want 2 && for c in c16 c64 paced; do
  case $c in
  paced) label="16 conns at $FULL_RATE/s" ;;
  *) label="${c#c} conns" ;;
  esac
  f=("$out"/s2-relay-$c-*.json)
  row "2 full path, $label" "relay → fixture" \
    "$(agg %.0f .throughput "${f[@]}")" \
    "$(agg %.2f '.latency_us.p50/1000' "${f[@]}")" \
    "$(agg %.2f '.latency_us.p99/1000' "${f[@]}")" \
    "relay $(agg %.1f '.server_cpu[0].us_per_answer' "${f[@]}"), fixture $(agg %.1f '.server_cpu[1].us_per_answer' "${f[@]}")" \
    "$(agg %.1f '.client_cpu.us_per_answer' "${f[@]}")" \
    "$(errors "${f[@]}")"
  f=("$out"/s2-direct-$c-*.json)
  row "2 full path, $label" "straight to fixture" \
    "$(agg %.0f .throughput "${f[@]}")" \
    "$(agg %.2f '.latency_us.p50/1000' "${f[@]}")" \
    "$(agg %.2f '.latency_us.p99/1000' "${f[@]}")" \
    "fixture $(agg %.1f '.server_cpu[0].us_per_answer' "${f[@]}")" \
    "$(agg %.1f '.client_cpu.us_per_answer' "${f[@]}")" \
    "$(errors "${f[@]}")"
done
want 3a && for s in alone during-flat during-paced; do
  f=("$out"/s3-$s-*.json)
  case $s in
  alone) label="CORE idle" ;;
  during-flat) label="$STORM_CONNS conns flat out on slow CORE" ;;
  during-paced) label="$STORM_CONNS conns at $STORM_RATE/s on slow CORE" ;;
  esac
  row "3 isolation, CLAIM $CLAIM_CONNS conns at $CLAIM_RATE/s (0000 answers)" "$label" \
    "$(agg %.0f .throughput "${f[@]}")" \
    "$(agg %.2f '.latency_ok_us.p50/1000' "${f[@]}")" \
    "$(agg %.2f '.latency_ok_us.p99/1000' "${f[@]}")" \
    "" \
    "" \
    "$(errors "${f[@]}"); CLAIM E905 $(share E905 "${f[@]}" | awk '{ printf "%.2f%%", $1 }')"
done
want 3a && for s in flat paced; do
  f=("$out"/s3-storm-$s-*.json)
  load_row "3 isolation, the storm ($s)" "$STORM_CONNS conns → CORE" \
    "; E905 $(share E905 "${f[@]}" | awk '{ printf "%.1f%%", $1 }')" "${f[@]}"
done
want 3b && open_report
want 6 && for c in ff full paced; do
  case $c in
  ff) label="fast-fail, $CONNS_FASTFAIL conns, depth 1" ;;
  full) label="full path, 16 conns" ;;
  paced) label="full path, 16 conns at $FULL_RATE/s" ;;
  esac
  for side in off on; do
    load_row "6 fleet, $label" "--state-store $side" "" "$out"/s6-$c-$side-*.json
  done
done

want 7 && page_report

want 4 && {
  declare -A idle_label=([relay]="relay" [redis]="redis-server" [base]="$BASE_LABEL relay")
  echo
  echo "| memory, $IDLE_CONNS idle connections, in the same run | server | KiB per connection | RSS held, MiB | lost |"
  echo "| --- | --- | ---: | ---: | ---: |"
  for mode in cold warm; do
    for side in "${idle_sides[@]}"; do
      f=("$out"/s4-$side-$mode-*.json)
      echo "| $mode | ${idle_label[$side]} | $(agg %.2f .kib_per_conn "${f[@]}") | $(agg %.1f '.rss_held_kib/1024' "${f[@]}") | $(jq -s 'map(.lost + .dial_errors) | add' "${f[@]}") |"
    done
  done
  echo
  echo "| memory ratios, per round (median (min–max) of $RUNS) | KiB per connection |"
  echo "| --- | ---: |"
  for mode in cold warm; do
    echo "| $mode, relay ÷ redis-server | $(agg %.2f .ratio "$out"/s4-pair-redis-$mode-*.json) |"
    if [[ -n $BASE_RELAY ]]; then
      echo "| $mode, relay ÷ $BASE_LABEL relay | $(agg %.2f .ratio "$out"/s4-pair-base-$mode-*.json) |"
    fi
  done
} >>"$out/table.md"
want 5 && {
  echo
  echo "| micro-benchmark | ns/op | B/op | allocs/op |"
  echo "| --- | ---: | ---: | ---: |"
  cat "$out/s5-micro.txt" "$out/s5-relay.txt" | awk '
    /^Benchmark/ && / ns\/op/ {
      name = $1; sub(/-[0-9]+$/, "", name)
      for (i = 2; i <= NF; i++) {
        if ($(i) == "ns/op") ns[name] = ns[name] " " $(i - 1)
        if ($(i) == "B/op") by[name] = $(i - 1)
        if ($(i) == "allocs/op") al[name] = $(i - 1)
      }
      if (!(name in seen)) { seen[name] = 1; order[++n] = name }
    }
    function stat(s,   v, k, i, j, t, m) {
      k = split(s, v, " ")
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
      m = (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
      return sprintf("%.1f (%.1f–%.1f)", m, v[1], v[k])
    }
    END { for (i = 1; i <= n; i++) printf "| %s | %s | %s | %s |\n", order[i], stat(ns[order[i]]), by[order[i]], al[order[i]] }'
} >>"$out/table.md"

want 8 && tls_report

want 9 && proxy_report
want 11 && adaptive_report
want 10 && for c in 16 64; do
  for side in off local fleet; do
    load_row "10 shield $side, $c conns" "relay → raw target" "" "$out"/s10-$side-c$c-*.json
  done
done

# Targets of the performance record, judged on medians.
want 1 && for d in 1 16; do
  r=$(med .ratio "$out"/s1-pair-d$d-*.json)
  verdict "fast-fail depth $d: relay answers/s ≥ redis PING: relay/redis = $(fmt %.2f "$r")×" "$(ge "$r" 1)"
  r=$(med .cpu_ratio "$out"/s1-pair-d$d-*.json)
  verdict "fast-fail depth $d: relay CPU per answer ≤ redis: relay/redis = $(fmt %.2f "$r")×" "$(le "$r" 1)"
  if [[ -n $BEFORE_RELAY ]]; then
    rb=$(med .ratio "$out"/s1-pairbefore-d$d-*.json)
    cb=$(med .cpu_ratio "$out"/s1-pairbefore-d$d-*.json)
    ra=$(med .ratio "$out"/s1-pairafter-d$d-*.json)
    ca=$(med .cpu_ratio "$out"/s1-pairafter-d$d-*.json)
    targets+=("BEFORE   fast-fail depth $d: relay before/redis answers/s $(fmt %.2f "$rb")×, CPU per answer $(fmt %.2f "$cb")×; relay/before answers/s $(fmt %.2f "$ra")×, CPU per answer $(fmt %.2f "$ca")×")
  fi
done
want 5 && allocs=$(awk '/^BenchmarkFastFailLine/ { for (i = 2; i <= NF; i++) if ($(i) == "allocs/op") print $(i - 1) }' "$out/s5-relay.txt" | sort -g | tail -n 1)
if [[ -n ${allocs:-} ]]; then
  verdict "fast-fail: no allocation per request: BenchmarkFastFailLine $allocs allocs/op" "$(le "$allocs" 0)"
fi
if want 2; then
r=$(med .ratio "$out"/s2-pair-c64-*.json)
verdict "full path 64 conns: relay ≥ 0.6× direct: $(fmt %.2f "$r")×" "$(ge "$r" 0.6)"
fi
want 2 && for c in c16 c64 paced; do
  o=$(med '.p99_overhead_us/1000' "$out"/s2-pair-$c-*.json)
  case $c in
  paced) label="16 conns at $FULL_RATE/s" ;;
  *) label="${c#c} conns, closed loop" ;;
  esac
  verdict "full path $label: p99 overhead < 1 ms: $(fmt %.2f "$o") ms" "$(lt "$o" 1)"
done
want 3a && for s in flat paced; do
  r=$(med .ok_p99_ratio "$out"/s3-pair-$s-*.json)
  e=$(share E905 "$out"/s3-during-$s-*.json)
  verdict "isolation ($s storm): CLAIM p99 ≤ 1.2× alone: $(fmt %.2f "$r")×, and CLAIM E905 $(fmt %.2f "$e")% of its answers" "$(le "$r" 1.2)"
done
want 3b && for side in "${io_sides[@]}"; do
  r=$(med .ok_p99_ratio "$out"/s3b-$side-pair-*.json)
  a=$(jq -s 'map(.codes["E905"] // 0) | add' "$out"/s3b-$side-alone-*.json)
  d=$(jq -s 'map(.codes["E905"] // 0) | add' "$out"/s3b-$side-during-*.json)
  verdict "isolation (open CORE, $side): CLAIM p99 during the storm ≤ 2× alone: $(fmt %.2f "$r")×" "$(le "$r" 2)"
  verdict "isolation (open CORE, $side): no CLAIM E905 from the storm: $d during, $a alone" "$(le "$d" "$a")"
done
want 4 && for mode in cold warm; do
  k=$(med .kib_per_conn "$out"/s4-relay-$mode-*.json)
  verdict "memory ($mode): < 8 KiB per idle connection: $(fmt %.2f "$k") KiB" "$(lt "$k" 8)"
  r=$(med .ratio "$out"/s4-pair-redis-$mode-*.json)
  verdict "memory ($mode): ≤ 3× redis-server per idle connection: relay/redis = $(fmt %.2f "$r")× ($(fmt %.2f "$k") KiB)" "$(le "$r" 3)"
done
if want 5; then
seq_ns=$(awk '$1 ~ /^BenchmarkClosedAllowSuccess-/ { print $3 }' "$out/s5-micro.txt" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
par_ns=$(awk '$1 ~ /^BenchmarkClosedAllowSuccessParallel-/ { print $3 }' "$out/s5-micro.txt" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
seq_allocs=$(awk '$1 ~ /^BenchmarkClosedAllowSuccess-/ { print $7 }' "$out/s5-micro.txt" | sort -g | tail -n 1)
if [[ -n $seq_ns && -n $par_ns ]]; then
  verdict "breaker: CLOSED admit+record < 25 ns, 0 allocs: $seq_ns ns, $seq_allocs allocs" \
    "$(($(lt "$seq_ns" 25) && $(le "${seq_allocs:-1}" 0)))"
  verdict "breaker: parallel ≤ sequential per op: $par_ns ns vs $seq_ns ns" "$(le "$par_ns" "$seq_ns")"
fi
fi
if want 6; then
  for c in ff full; do
    r=$(med .ratio "$out"/s6-pair-$c-*.json)
    verdict "fleet $c: answers/s with --state-store within 5 % of without: on/off = $(fmt %.3f "$r")×" "$(ge "$r" 0.95)"
  done
  r=$(med .p99_ratio "$out"/s6-pair-paced-*.json)
  verdict "fleet, full path at $FULL_RATE/s: p99 with --state-store within 5 % of without: on/off = $(fmt %.3f "$r")×" "$(le "$r" 1.05)"
  prop=$(grep -o 'p50 [^,]*, p99 [^,]*' "$out/s6-propagation.txt" | head -n 1) || true
  p99ms=$(grep -o 'p99 [0-9.]*[µm]*s' "$out/s6-propagation.txt" | head -n 1 | awk '{ v = $2; if (v ~ /µs$/) { sub(/µs$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else { sub(/s$/, "", v); v *= 1000 } print v }') || true
  verdict "fleet: a trip on one hub answered E904 by the others, 20 trips: ${prop:-no figures} (p99 ≤ 100 ms)" "$(le "${p99ms:-1000}" 100)"
fi

want 10 && for c in 16 64; do
  for side in local fleet; do
    r=$(med .ratio "$out"/s10-pair-$side-c$c-*.json)
    cr=$(med .cpu_ratio "$out"/s10-pair-$side-c$c-*.json)
    cpu=$(med .cpu_a "$out"/s10-pair-$side-c$c-*.json)
    verdict "shield $side, $c conns: replies/s $side/off = $(fmt %.3f "$r")×, CPU per transaction (relay+target+Redis) $(fmt %.1f "$cpu") µs, $side/off = $(fmt %.3f "$cr")× (a cost, reported)" 1
  done
done
want 11 && adaptive_verdicts
want 9 && for c in 16 64; do
  r=$(med .ratio "$out"/s9-pair-hub-haproxy-c$c-*.json)
  verdict "full path $c conns: hub replies/s ≥ HAProxy: hub/HAProxy = $(fmt %.2f "$r")×" "$(ge "$r" 1)"
  r=$(med .cpu_ratio "$out"/s9-pair-hub-haproxy-c$c-*.json)
  verdict "full path $c conns: hub server CPU per transaction (target included) ≤ HAProxy: hub/HAProxy = $(fmt %.2f "$r")×" "$(le "$r" 1)"
done

{
  echo
  echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(go version | cut -d' ' -f3-)."
  if want 1 && want 2; then
  echo "Medians of $RUNS runs of ${DURATION}s, (min–max). CPU the machine spent on other processes (and the kernel's network work not charged to any) during scenarios 1 and 2: $(agg %.2f '.machine_busy_cores - ((.server_cpu // []) | map(.cores) | add // 0) - .client_cpu.cores' "$out"/s1-re*-*.json "$out"/s2-[rd]*-*.json) cores of $(nproc)."
  relay_sum=$(med '.client_cpu.us_per_answer + .server_cpu[0].us_per_answer + .server_cpu[1].us_per_answer' "$out"/s2-relay-c64-*.json)
  direct_sum=$(med '.client_cpu.us_per_answer + .server_cpu[0].us_per_answer' "$out"/s2-direct-c64-*.json)
  echo "CPU per transaction at 64 conns, every process: relay path $(fmt %.0f "$relay_sum") µs (load tool + relay + fixture), straight $(fmt %.0f "$direct_sum") µs (load tool + fixture); on a CPU-bound machine the ratio of throughputs tends to their inverse, $(fmt %.2f "$(awk -v a="$direct_sum" -v b="$relay_sum" 'BEGIN { print a / b }')")×."
  fi
  if want 9; then
  echo "Scenario 9: CPU the machine spent on other processes during its runs: $(agg %.2f '.machine_busy_cores - ((.server_cpu // []) | map(.cores) | add // 0) - .client_cpu.cores' "$out"/s9-[hbd]*-c*-*.json) cores of $(nproc); load average at the end $(cut -d' ' -f1-3 /proc/loadavg)."
  fi
} >>"$out/table.md"
end_table
