#!/usr/bin/env bash
# Plays fleet mode (docs/FLEET.md) against real binaries: Redis, a CORE
# fixture, three hubs sharing their breaker state through Redis, and HAProxy
# in front of them (mode tcp, round robin), all on free loopback ports so a
# `make run` elsewhere is not disturbed. It shows a trip on one hub refused
# by every hub, a restarted hub starting open, one probe for the whole
# fleet, and the hubs serving on after Redis is killed. It stops with a
# non-zero status and a message at the first step that does not behave as
# docs/FLEET.md says. Needs bash, curl, redis-server and haproxy (installed
# with apt-get when missing and run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

RESET_TIMEOUT=5s
THRESHOLD=3

if [[ ! -x bin/relay || ! -x bin/fixture || ! -x bin/relayctl ]]; then
  make build
fi
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "fleet-demo needs ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
  fi
  apt-get update >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

work=$(mktemp -d)
pids=()

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
  echo "FLEET DEMO FAILED: $*" >&2
  local f
  for f in "$work"/hub-*.log; do
    [[ -s "$f" ]] || continue
    echo "--- last lines of $(basename "$f") ---" >&2
    tail -n 10 "$f" >&2
  done
  exit 1
}

step() { printf '\n== %s ==\n' "$*"; }

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# start_hub ID LISTEN: starts hub ID; sets HUB_PID, HUB_ADDR, HUB_ADMIN.
start_hub() {
  bin/relay --listen "$2" --admin-listen 127.0.0.1:0 --hub-id "$1" \
    --state-store "redis://127.0.0.1:$redis_port" --target "CORE=$core" \
    --fail-threshold "$THRESHOLD" --reset-timeout "$RESET_TIMEOUT" --target-timeout 2s \
    --breaker-log "$work/breaker-$1.log" --in-doubt-log "$work/in-doubt-$1.log" 2>"$work/hub-$1.log" &
  HUB_PID=$!
  pids+=("$HUB_PID")
  HUB_ADDR=$(wait_addr "$work/hub-$1.log")
  HUB_ADMIN=$(wait_field "$work/hub-$1.log" admin_addr)
}

# send ADDR TXID: sends one CORE transaction and prints its answer.
send() { bin/relayctl send --addr "$1" --txid "$2" CORE 'BAL 1001' || true; }

# expect ADDR TXID CODE: sends one transaction and checks its code.
expect() {
  local got
  got=$(send "$1" "$2")
  echo "  $2 -> $got"
  [[ "$(cut -d'|' -f2 <<<"$got")" == "$3" ]] || die "$2: want $3, got: $got"
}

# core_field ID FIELD: prints a field of CORE's /status entry on hub ID.
core_field() {
  curl -fsS "http://${admin[$1]}/status" | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2- | tr -d '"'
}

# store_connected ID: prints true or false.
store_connected() { curl -fsS "http://${admin[$1]}/status" | grep -o '"store_connected":[a-z]*' | cut -d: -f2; }

# calls: prints how many calls the CORE fixture has received.
calls() { curl -fsS "$core/_stats" | grep -o '"calls":[0-9]*' | cut -d: -f2; }

# ctl JSON: switches the CORE fixture's mode.
ctl() {
  echo "  \$ curl -XPOST $core/_ctl -d '$1'"
  curl -fsS -XPOST "$core/_ctl" -d "$1" >/dev/null || die "fixture control $1 failed"
}

# show_hubs: one line per hub: CORE's state and its shared state.
show_hubs() {
  local id
  for id in a b c; do
    printf '  hub %s: %-9s epoch=%s opened_by=%s source=%s store_connected=%s\n' "$id" \
      "$(core_field "$id" state)" "$(core_field "$id" epoch)" "$(core_field "$id" opened_by)" \
      "$(core_field "$id" source)" "$(store_connected "$id")"
  done
}

step "Starting Redis, a CORE fixture, three hubs and HAProxy"
# listening PORT: waits up to 5 s for something to listen on PORT.
listening() {
  for _ in $(seq 100); do
    (exec 9<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
listening "$redis_port" || die "redis-server did not start: $(cat "$work/redis.log")"
bin/fixture --name CORE --kind core --listen 127.0.0.1:0 >/dev/null 2>"$work/fixture.log" &
pids+=($!)
core="http://$(wait_addr "$work/fixture.log")"
declare -A addr admin pid
for id in a b c; do
  start_hub "$id" 127.0.0.1:0
  addr[$id]=$HUB_ADDR admin[$id]=$HUB_ADMIN pid[$id]=$HUB_PID
done
lb_port=$(free_port)
lb=127.0.0.1:$lb_port
cat >"$work/haproxy.cfg" <<EOF
global
  maxconn 1000

defaults
  mode tcp
  timeout connect 1s
  timeout client 1m
  timeout server 1m

frontend relay
  bind $lb
  default_backend hubs

backend hubs
  balance roundrobin
  server a ${addr[a]}
  server b ${addr[b]}
  server c ${addr[c]}
EOF
"$HAPROXY" -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
pids+=($!)
listening "$lb_port" || die "haproxy did not start: $(cat "$work/haproxy.log")"
echo "  redis at 127.0.0.1:$redis_port, CORE fixture at $core"
echo "  hubs a=${addr[a]} b=${addr[b]} c=${addr[c]}: --fail-threshold $THRESHOLD --reset-timeout $RESET_TIMEOUT"
echo "  HAProxy at $lb, mode tcp, round robin over the three"
for id in a b c; do
  for _ in $(seq 100); do
    [[ "$(store_connected "$id")" == true ]] && break
    sleep 0.05
  done
  [[ "$(store_connected "$id")" == true ]] || die "hub $id does not reach Redis"
done
for i in 1 2 3; do expect "$lb" "n$i" 0000; done

step "1. CORE fails; hub a alone sees $THRESHOLD failures and trips: every hub refuses"
ctl '{"mode":"fail"}'
for i in $(seq "$THRESHOLD"); do expect "${addr[a]}" "f$i" E500; done
before=$(calls)
for i in 1 2 3 4 5 6; do expect "$lb" "r$i" E904; done
[[ "$(calls)" == "$before" ]] || die "CORE was called while the fleet refused"
echo "  CORE fixture calls before/after the six E904s: $before/$(calls)"
show_hubs
for id in b c; do
  [[ "$(core_field "$id" opened_by)" == a ]] || die "hub $id does not say hub a opened CORE"
done

step "2. Hub b restarts while the fleet is open: its first answer is E904"
kill -TERM "${pid[b]}"
wait "${pid[b]}" || die "hub b did not stop cleanly"
start_hub b "${addr[b]}"
pid[b]=$HUB_PID admin[b]=$HUB_ADMIN
expect "${addr[b]}" first-after-restart E904
show_hubs

step "3. CORE recovers: after the reset timeout, one probe for the whole fleet"
ctl '{"mode":"slow","delay_ms":700,"reset":true}'
echo "  (CORE answers after 700 ms, so the probe is still out while nine requests arrive)"
leaseholder=
for _ in $(seq 200); do
  for id in a b c; do
    if [[ "$(core_field "$id" probe_lease)" == true ]]; then leaseholder=$id; fi
  done
  [[ -n "$leaseholder" ]] && break
  sleep 0.05
done
[[ -n "$leaseholder" ]] || die "no hub won the probe lease within 10 s"
echo "  hub $leaseholder won the probe lease"
sends=()
for i in $(seq 9); do
  send "$lb" "p$i" >"$work/p$i.out" &
  sends+=($!)
done
for p in "${sends[@]}"; do wait "$p"; done
ok=0
for i in $(seq 9); do
  echo "  p$i -> $(cat "$work/p$i.out")"
  [[ "$(cut -d'|' -f2 <"$work/p$i.out")" == 0000 ]] && ok=$((ok + 1))
done
[[ "$(calls)" == 1 ]] || die "want 1 call to CORE for the fleet's probe, got $(calls)"
[[ "$ok" == 1 ]] || die "want exactly one 0000 (the probe), got $ok"
echo "  CORE fixture calls: $(calls)"
for _ in $(seq 40); do
  [[ "$(core_field a state)$(core_field b state)$(core_field c state)" == CLOSEDCLOSEDCLOSED ]] && break
  sleep 0.05
done
show_hubs
[[ "$(core_field a state)$(core_field b state)$(core_field c state)" == CLOSEDCLOSEDCLOSED ]] || die "the probe's success did not close every hub"
ctl '{"mode":"normal"}'

step "4. Redis is killed (kill -9): the hubs keep serving, each on its own breaker"
kill -KILL "$redis_pid"
wait "$redis_pid" 2>/dev/null || true
for i in 1 2 3 4 5 6; do expect "$lb" "k$i" 0000; done
for id in a b c; do
  for _ in $(seq 60); do
    [[ "$(store_connected "$id")" == false ]] && break
    sleep 0.05
  done
done
show_hubs

step "5. The breaker logs: each hub's own chain"
echo "  (hub b's second CLOSED->OPEN is its restart: a new process starts CLOSED and adopts the fleet's open breaker)"
for id in a b c; do
  echo "  hub $id:"
  sed 's/^/    /' "$work/breaker-$id.log"
done

printf '\nFleet demo OK: every step behaved as docs/FLEET.md describes.\n'
