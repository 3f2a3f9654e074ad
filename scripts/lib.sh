# Helpers shared by the scripts that start the binaries. Source it after
# defining die MESSAGE, which the helpers call when they give up.

# free_port: prints a loopback port nobody listens on, below Linux's
# ephemeral range (32768 and up) so no outgoing connection takes it
# meanwhile.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 9<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  die "no free port found"
}

# wait_field LOG FIELD: prints the string FIELD of the first JSON line of
# LOG that has it, such as the "addr" a relay or fixture logs once it
# listens; waits up to 10 s.
wait_field() {
  local v
  for _ in $(seq 200); do
    v=$(grep -o "\"$2\":\"[^\"]*\"" "$1" 2>/dev/null | head -n 1 | cut -d'"' -f4) || true
    if [[ -n $v ]]; then
      echo "$v"
      return
    fi
    sleep 0.05
  done
  die "no $2 in $1 after 10 s: $(tail -n 5 "$1")"
}

# wait_addr LOG: prints the address a relay or fixture logs once listening.
wait_addr() { wait_field "$1" addr; }
