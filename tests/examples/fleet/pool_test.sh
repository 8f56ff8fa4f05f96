#!/usr/bin/env bash
# A pool of 50 worker processes on one host, for real: their downstream answers 503 for 4 s
# (bench/stampede/scenarios/pool50_probes_short.toml), every breaker trips, and each one lets
# its half-open probe through when its open period ends. Per process that is a probe from
# (nearly) every worker; through retryd, one probe per half-open episode of the host's
# breaker, never two at once. The probes are counted by the downstream (X-Retryd-Probe).
# Each run ends when every breaker that tripped has closed again (--stop_when_closed): the
# test waits for the recovery, however slow the machine, up to the scenario's 40 s.
# Usage: pool_test.sh BUILD_DIR SOURCE_DIR WORKDIR
set -euo pipefail
build=$1 src=$2 dir=$3
fleet=$(find "$build" -name retryd_fleet -type f -perm -u+x | head -1)
retryd=$build/daemon/retryd
scenario=$src/bench/stampede/scenarios/pool50_probes_short.toml
workers=50
rm -rf "$dir" && mkdir -p "$dir"
# shellcheck source=examples/fleet/daemons.sh
. "$src/examples/fleet/daemons.sh"  # wait_ready, stop_pids
daemon_pid="" segment=retryd-pool-test-$$
cleanup() {
  [ -z "$daemon_pid" ] || stop_pids "$daemon_pid"
  rm -f "/dev/shm/$segment"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# field CSV COLUMN: that column of the summary's one row.
field() { awk -F, -v c="$2" 'NR == 1 { for (i = 1; i <= NF; ++i) idx[$i] = i; next } { print $idx[c] }' "$1"; }
# downstream TXT: "PROBES MAX_AT_ONCE", counted by the downstream.
downstream() { sed -n 's/.* \([0-9]*\) probes among them, at most \([0-9]*\) probes at once.*/\1 \2/p' "$1"; }

run() {  # run STRATEGY [flags...]
  "$fleet" --scenario="$scenario" --strategy="$1" --workdir="$dir" --stop_when_closed \
    --summary_csv="$dir/$1.csv" "${@:2}" >"$dir/$1.txt" 2>&1 || { cat "$dir/$1.txt" >&2; fail "$1: retryd_fleet failed"; }
  grep -q "^ended at" "$dir/$1.txt" ||
    fail "$1: not every breaker had closed again by the scenario's end (the failover ended at 6 s of 40)"
}

# Per process: every worker's own breaker trips and sends its own probe.
run per-process
read -r pp_probes pp_at_once < <(downstream "$dir/per-process.txt")
pp_tripped=$(field "$dir/per-process.csv" breakers_tripped)
echo "per-process: $pp_tripped of $workers breakers tripped; the downstream read $pp_probes probes, up to $pp_at_once at once"
[ "$pp_tripped" -ge $((workers / 2)) ] || fail "per-process: only $pp_tripped of $workers breakers tripped"
[ "$pp_probes" -ge "$pp_tripped" ] ||
  fail "per-process: $pp_probes probes for $pp_tripped tripped breakers (one each, at least)"

# Through retryd: one breaker for the host, one probe per half-open episode.
"$fleet" --scenario="$scenario" --strategy=retryd --print_config >"$dir/retryd.toml"
"$retryd" --config="$dir/retryd.toml" --segment="$segment" --tick_ms=10 --logtostderr >"$dir/retryd.log" 2>&1 &
daemon_pid=$!
wait_ready "$daemon_pid" "$dir/retryd.log" || fail "retryd did not start"
run retryd --segment="$segment"
read -r rd_probes rd_at_once < <(downstream "$dir/retryd.txt")
rd_tripped=$(field "$dir/retryd.csv" breakers_tripped)
rd_half_open=$(field "$dir/retryd.csv" half_opened)
echo "retryd: $rd_tripped of 1 breaker tripped, $rd_half_open half-open episodes; the downstream read $rd_probes probes, up to $rd_at_once at once"
[ "$rd_tripped" -eq 1 ] || fail "retryd: the host's breaker did not trip"
[ "$rd_probes" -ge 1 ] || fail "retryd: no probe reached the downstream"
[ "$rd_probes" -le "$rd_half_open" ] || fail "retryd: $rd_probes probes for $rd_half_open half-open episodes"
[ "$rd_at_once" -le 1 ] || fail "retryd: $rd_at_once probes at once"
[ "$pp_probes" -ge $((10 * rd_probes)) ] || fail "per-process sent $pp_probes probes, not 10x retryd's $rd_probes"
# The host's budget: the retries of the busiest second within what it grants in that second,
# and some denied (the failover asks for more).
rd_peak=$(field "$dir/retryd.csv" peak_retries_1s) rd_bound=$(field "$dir/retryd.csv" retry_bound_1s)
rd_denied=$(field "$dir/retryd.csv" retries_denied)
echo "retryd: $rd_peak retries in the busiest second, the budget's bound $rd_bound; $rd_denied denied"
[ "$rd_peak" -le $((rd_bound + rd_bound / 10 + 2)) ] || fail "retryd: $rd_peak retries in a second, over the budget's $rd_bound"
[ "$rd_denied" -ge 1 ] || fail "retryd: the budget denied no retry"
echo "pool: OK (per process $pp_probes probes from $pp_tripped breakers; through retryd $rd_probes)"
