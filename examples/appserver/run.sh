#!/usr/bin/env bash
# examples/appserver/run.sh: the recovery stampede on a real application server.
#
#   examples/appserver/run.sh BUILD [SCENARIO [OUTDIR]]
#
# For each strategy (the four fixes per process, then through retryd) and each of RUNS runs, it
# starts, all in a private temporary directory and on a segment of its own:
#   - retryd, with the strategy's policy (retryd_appserver_load --print_config): one dependency
#     `downstream` for the host, or, per process, [defaults] for the `downstream.PID` that each
#     child creates on its first call;
#   - php-fpm (pm = static, CHILDREN children) serving worker.php, which calls the downstream
#     with the strategy's retry loop through the PHP binding (bindings/php);
#   - nginx in front of it (fastcgi_pass), listening on a Unix socket;
#   - retryd_downstream on the scenario (examples/fleet/downstream.cc): pods, stall, kills;
#   - retryd_appserver_load, the open-loop generator (Poisson arrivals at the scenario's rate),
#     which reports each run with the simulator's code;
# then stops them and prints the runs side by side (summary.py). Everything it started is
# stopped on exit, whatever the exit, and the segments are removed.
#
# Environment: RUNS (3), CHILDREN (64), STRATEGIES ("per-process retryd"), PHP_EXT (a built
# retryd.so; default BUILD/tests/bindings/php/ext/retryd.so, else it is built into OUTDIR).
# SCENARIO defaults to bench/stampede/scenarios/loopback.toml. Needs php-fpm, php-curl and nginx
# (Debian: php-fpm php-curl nginx); as root, php-fpm and nginx run as root, so that a clone in
# a directory only root can enter works.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
[ $# -ge 1 ] || { sed -n '2,4p' "$0" >&2; exit 2; }
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
scenario=$(realpath "${2:-$root/bench/stampede/scenarios/loopback.toml}")
out=${3:-$(mktemp -d /tmp/retryd-appserver-out.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
runs=${RUNS:-3}
children=${CHILDREN:-64}
read -r -a strategies <<<"${STRATEGIES:-per-process retryd}"

find_bin() { find "$build" -name "$1" -type f -perm -u+x | head -1; }
load=$(find_bin retryd_appserver_load)
downstream=$(find_bin retryd_downstream)
retryd=$build/daemon/retryd
for b in "$load" "$downstream" "$retryd"; do
  [ -n "$b" ] && [ -x "$b" ] || { echo "run.sh: not built in $build: $b" >&2; exit 1; }
done
fpm=$(command -v php-fpm8.2 || command -v php-fpm || true)
nginx=$(command -v nginx || true)
[ -n "$fpm" ] || { echo "run.sh: php-fpm not found (apt-get install php-fpm)" >&2; exit 3; }
[ -n "$nginx" ] || { echo "run.sh: nginx not found (apt-get install nginx)" >&2; exit 3; }
php -r 'exit(extension_loaded("curl") ? 0 : 1);' 2>/dev/null || { echo "run.sh: PHP has no curl (apt-get install php-curl)" >&2; exit 3; }

ext=${PHP_EXT:-$build/tests/bindings/php/ext/retryd.so}
if [ ! -f "$ext" ]; then
  ext=$out/ext/retryd.so
  if [ ! -f "$ext" ]; then
    # As bindings/php/README.md builds it from source: phpize, config.m4 on this build tree.
    echo "run.sh: building the PHP extension into $out/ext" >&2
    ext_src=$out/ext-src
    rm -rf "$ext_src" && mkdir -p "$ext_src" "$out/ext"
    cp "$root"/bindings/php/{config.m4,retryd.c,php_retryd.h} "$ext_src"/
    (cd "$ext_src" && phpize && ./configure --with-retryd-include="$root/client/include" \
       --with-retryd-lib="$build/client/libretryd.so" && make -j"$(nproc)") \
      >"$out/ext-build.log" 2>&1 || { cat "$out/ext-build.log" >&2; exit 1; }
    cp "$ext_src/modules/retryd.so" "$ext"
  fi
fi

work=$(mktemp -d /tmp/retryd-appserver.XXXXXX)
pids=() segments=()
stop_all() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
  local s
  for s in "${segments[@]}"; do rm -f "/dev/shm/$s"; done
  segments=()
}
cleanup() {
  stop_all
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for WHAT COMMAND...: polls COMMAND for 60 s (a loaded machine is slow, not broken).
wait_for() {
  local what=$1
  shift
  for _ in $(seq 1200); do
    "$@" && return 0
    sleep 0.05
  done
  echo "run.sh: timed out waiting for $what" >&2
  return 1
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
fpm_ready() { [ -S "$1/fpm.sock" ] && grep -q "ready to handle connections" "$1/fpm.log" 2>/dev/null; }
show_logs() {
  local f
  for f in "$1"/*.log "$1"/nginx/error.log; do
    [ -s "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
  done
  return 0
}

run_one() {
  local st=$1 n=$2
  local dir=$work/$st.$n
  mkdir -p "$dir/nginx/tmp"
  local segment=retryd-appserver-$$-$st-$n
  segments+=("$segment")
  "$load" --scenario="$scenario" --strategy="$st" --print_config >"$dir/retryd.toml"
  "$retryd" --config="$dir/retryd.toml" --segment="$segment" --tick_ms=10 --logtostderr \
    >"$dir/retryd.log" 2>&1 &
  pids+=($!)
  # Ready once it says so: its segment exists a moment before it is initialized.
  wait_for "retryd to be ready" grep -q "daemon: ready" "$dir/retryd.log" ||
    { show_logs "$dir"; return 1; }

  local port
  port=$(free_port)
  sed -e "s|@DIR@|$dir|g" -e "s|@CHILDREN@|$children|g" -e "s|@SEGMENT@|$segment|g" \
    -e "s|@PORT@|$port|g" -e '/@ENV@/d' "$here/php-fpm.conf.in" >"$dir/php-fpm.conf"
  "$load" --scenario="$scenario" --strategy="$st" --print_env | sed 's/^\([A-Z_]*\)=\(.*\)$/env[\1] = \2/' \
    >>"$dir/php-fpm.conf"
  local as_root=() user=""
  if [ "$(id -u)" = 0 ]; then
    as_root=(--allow-to-run-as-root)
    user="user root;"  # else nginx's workers run as nobody, who cannot enter a 0700 clone
  fi
  "$fpm" --nodaemonize --fpm-config "$dir/php-fpm.conf" -d "extension=$ext" "${as_root[@]}" \
    >"$dir/fpm-out.log" 2>&1 &
  pids+=($!)
  # php-fpm's master makes a session and process group of its own, which a kill of this
  # script's group (a test runner's SIGKILL) does not reach: a watchdog in a session of its own
  # kills the pool's group once this script is gone, if the master is still the one started
  # here (its start time), and ends with the master.
  # shellcheck disable=SC2016  # the watchdog's own arguments
  setsid bash -c 'started() { sed "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -d" " -f20; }
    t=$(started "$2")
    while kill -0 "$1" 2>/dev/null; do
      [ "$(started "$2")" = "$t" ] || exit 0
      sleep 1
    done
    [ -n "$t" ] && [ "$(started "$2")" = "$t" ] && kill -KILL -- "-$2"' \
    _ $$ "$!" </dev/null >/dev/null 2>&1 &
  wait_for "php-fpm to be ready" fpm_ready "$dir" || { show_logs "$dir"; return 1; }
  sed -e "s|@DIR@|$dir|g" -e "s|@WORKER@|$here/worker.php|g" -e "s|@USER@|$user|g" \
    "$here/nginx.conf.in" >"$dir/nginx.conf"
  "$nginx" -p "$dir/nginx" -c "$dir/nginx.conf" -e "$dir/nginx/error.log" >"$dir/nginx-out.log" 2>&1 &
  pids+=($!)
  wait_for "nginx to listen" test -S "$dir/front.sock" || { show_logs "$dir"; return 1; }
  python3 "$here/warm.py" "$dir/front.sock" "$children" >"$dir/warm.log" 2>&1 ||
    { cat "$dir/warm.log" >&2; show_logs "$dir"; return 1; }

  # The downstream's start is the scenario's t = 0; the generator starts its arrivals there.
  "$downstream" --scenario="$scenario" --port="$port" --port_file="$dir/downstream.port" \
    --bins="$dir/downstream.bins" --seed="$n" --drain_s=6 >"$dir/downstream.log" 2>&1 &
  local ds=$! load1
  pids+=("$ds")
  load1=$(cut -d' ' -f1 /proc/loadavg)
  echo "== run $n/$runs: $st ($children php-fpm children; load average $(cut -d' ' -f1-3 /proc/loadavg))"
  if ! "$load" --scenario="$scenario" --strategy="$st" --front="$dir/front.sock" \
      --port_file="$dir/downstream.port" --bins="$dir/downstream.bins" --downstream_pid="$ds" \
      --segment="$segment" --seed="$n" --label="$st" --summary_csv="$out/summary.csv" \
      --csv="$out/$st.$n.csv" --log="$out/$st.$n.requests" >"$out/$st.$n.txt" 2>&1; then
    cat "$out/$st.$n.txt" >&2
    show_logs "$dir"
    return 1
  fi
  cat "$out/$st.$n.txt"
  sed -n "s/^RESULT /RESULT run=$n children=$children load1=$load1 /p" "$out/$st.$n.txt" >>"$out/results.txt"
  cp "$dir/php-fpm.conf" "$dir/nginx.conf" "$dir/retryd.toml" "$out/" 2>/dev/null || true
  stop_all
  # What each process said, beside the run's report.
  for f in retryd.log downstream.log fpm-out.log nginx/error.log; do
    cp "$dir/$f" "$out/$st.$n.$(basename "$f")" 2>/dev/null || true
  done
}

rm -f "$out/results.txt" "$out/summary.csv"
for n in $(seq "$runs"); do
  for st in "${strategies[@]}"; do
    run_one "$st" "$n"
  done
done
echo
python3 "$here/summary.py" "$out/results.txt" "$out/summary.csv"
echo "(each run's report, time series and requests: $out)"
