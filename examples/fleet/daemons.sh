# shellcheck shell=bash
# examples/fleet/daemons.sh: the one way the real fleet's scripts start the daemons a strategy
# runs on (sourced by compare.sh and fleet_compare.sh; bash).
#
#   start_hosts FLEET RETRYD SCENARIO STRATEGY SCOPE HOSTS OUTDIR TAG
#       For a `host` strategy one retryd per host, each on a fresh segment of its own, all with
#       the strategy's policy (retryd_fleet --print_config); for a `fleet` strategy first a
#       redis-server of its own on 127.0.0.1, then one retryd per host with its host id and the
#       store (--print_config --host_index --redis). Nothing for a `process` strategy. Returns
#       once every daemon has logged "daemon: ready" (its segment exists a moment before it is
#       initialized: a worker that attaches then finds no dependency) and, for a fleet, that it
#       joined the store (until then it decides alone, which no scenario models); 1 if one
#       exited or was not ready within 10 s, 3 if one had not joined 10 s after it was. Sets `host_segments` (comma-separated, in host order); the logs
#       are OUTDIR/retryd-TAG-H.log and OUTDIR/redis-TAG.log.
#   stop_started
#       Stops what start_hosts started (by the pids it saved) and removes its segments.
#   wait_ready PID LOG [TEXT]
#       Until LOG says TEXT (default "daemon: ready"; 10 s at most, or until PID exits): 0 once
#       it does.
#   stop_pids PID...
#       Asks each process to stop (SIGTERM, and SIGCONT for one that was stopped), gives it 10 s,
#       then kills it (SIGKILL); each is reaped. A stopped daemon cannot hang its caller.
# Environment: REDIS_SERVER (default: redis-server on the PATH).

started_pids=() started_segments=() host_segments=""

stop_pids() {
  local p _
  for p in "$@"; do
    kill -TERM "$p" 2>/dev/null || true
    kill -CONT "$p" 2>/dev/null || true
  done
  for p in "$@"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}

stop_started() {
  local s
  stop_pids "${started_pids[@]}"
  for s in "${started_segments[@]}"; do rm -f "/dev/shm/$s"; done
  started_pids=() started_segments=() host_segments=""
}

# wait_ready PID LOG [TEXT]: until LOG says TEXT ("daemon: ready"); 1 if PID exits first or
# after 10 s.
wait_ready() {
  local pid=$1 log=$2 text=${3:-daemon: ready} _
  for _ in $(seq 200); do
    grep -qF "$text" "$log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "daemons.sh: the retryd logging to $log is not ready (no '$text' within 10 s):" >&2
  tail -5 "$log" >&2
  return 1
}

# start_redis LOG: a redis-server of its own on a free port of 127.0.0.1; sets `redis_port`.
start_redis() {
  local log=$1 redis=${REDIS_SERVER:-$(command -v redis-server || true)} _
  [ -x "$redis" ] || { echo "daemons.sh: no redis-server (Debian: apt-get install redis-server)" >&2; return 1; }
  redis_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$redis" --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$log" 2>&1 &
  started_pids+=($!)
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "daemons.sh: redis-server did not listen on $redis_port" >&2
  return 1
}

start_hosts() {
  local fleet=$1 retryd=$2 scenario=$3 strategy=$4 scope=$5 hosts=$6 out=$7 tag=$8
  local h seg config fleet_args=() pids=()
  host_segments=""
  [ "$scope" = process ] && return 0
  if [ "$scope" = fleet ]; then
    start_redis "$out/redis-$tag.log" || return 1
    fleet_args=(--redis="127.0.0.1:$redis_port" --key_prefix="fleet-$$-$tag")
  fi
  for h in $(seq 0 $((hosts - 1))); do
    seg=retryd-fleet-$$-$tag-$h config=$out/retryd-$tag-$h.toml
    "$fleet" --scenario="$scenario" --strategy="$strategy" --print_config --host_index="$h" \
      "${fleet_args[@]}" >"$config" || return 1
    "$retryd" --config="$config" --segment="$seg" --tick_ms=10 --logtostderr \
      >"$out/retryd-$tag-$h.log" 2>&1 &
    started_pids+=($!) started_segments+=("$seg")
    pids+=($!)
    host_segments+=${host_segments:+,}$seg
  done
  for h in $(seq 0 $((hosts - 1))); do
    wait_ready "${pids[$h]}" "$out/retryd-$tag-$h.log" || return 1
    if [ "$scope" = fleet ]; then
      wait_ready "${pids[$h]}" "$out/retryd-$tag-$h.log" "fleet: host host-$h joined" || return 3
    fi
  done
}
