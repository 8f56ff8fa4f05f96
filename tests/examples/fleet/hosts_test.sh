#!/usr/bin/env bash
# Four hosts of 16 worker processes on this one machine, for real, beside the simulator: their
# downstream answers 503 for 4 s (bench/stampede/scenarios/hosts4_pool16_probes_short.toml),
# every breaker trips, and each lets its half-open probe through when its open period ends.
# Through retryd (one daemon per host, each host's workers on its own host's daemon, started by
# examples/fleet/daemons.sh as compare.sh starts them) that is one probe per host; per process,
# one from (nearly) every worker. The probes are counted by the downstream, per host
# (X-Retryd-Host). Each run ends once every breaker that tripped has closed again
# (--stop_when_closed), up to the scenario's 40 s; the simulator runs the same file over 5 seeds.
#
# It fails if a breaker never closes again, if a host's budget does not bind (the retries of
# the busiest second over its bound x 1.1 + 2, or none denied), or if the counts disagree with
# the simulator beyond these tolerances (a real figure agrees when it lies within the
# tolerance of the simulated seeds' range):
#   - through retryd: breakers that tripped: exactly; probes per reopening: 1; each host's
#     probes read by the downstream: at least 1, never 2 at once from one host;
#   - per process: breakers that tripped, probes per reopening and each host's probes read by
#     the downstream: 25 %; and at least 8 times retryd's probes per reopening.
# The rates are not compared (a machine short of CPU starts calls late and sends fewer retries:
# the budgets' bound is what must hold), and fleet_compare.py's per-host table is printed
# beside the counts, not checked: its timings and rates (first open, attempts during the
# failover) move with when the workers start, which this short form (the failover 2 s after
# the start) makes part of the baseline; hosts4_pool16_probes.toml compares them at length
# (docs/STAMPEDE.md, "Several hosts on one machine").
# Usage: hosts_test.sh BUILD_DIR SOURCE_DIR WORKDIR
set -euo pipefail
build=$1 src=$2 dir=$3
fleet=$(find "$build" -name retryd_fleet -type f -perm -u+x | head -1)
retryd=$build/daemon/retryd
stampede=$build/bench/stampede/retryd_stampede
scenario=$src/bench/stampede/scenarios/hosts4_pool16_probes_short.toml
rm -rf "$dir" && mkdir -p "$dir"
# shellcheck source=examples/fleet/daemons.sh
. "$src/examples/fleet/daemons.sh"
trap stop_started EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
hosts=$("$stampede" --scenario="$scenario" --print_hosts)

# field CSV STRATEGY COLUMN: that column of the strategy's rows, one a line.
field() {
  awk -F, -v s="$2" -v c="$3" 'NR == 1 { for (i = 1; i <= NF; ++i) idx[$i] = i; next }
    $idx["strategy"] == s { print $idx[c] }' "$1"
}
# within REAL TOL SIM_VALUES...: REAL lies within [min - t, max + t] of the simulated values,
# t = TOL (a number) or, with a trailing %, that share of the largest.
within() {
  python3 - "$@" <<'EOF'
import sys
real, tol, sim = float(sys.argv[1]), sys.argv[2], [float(v) for v in sys.argv[3:]]
t = float(tol[:-1]) / 100 * max(sim + [real]) if tol.endswith("%") else float(tol)
sys.exit(0 if min(sim) - t <= real <= max(sim) + t else 1)
EOF
}

"$stampede" --scenario="$scenario" --strategies=per-process,retryd --runs=5 \
  --runs_csv="$dir/sim.csv" >"$dir/sim.txt"

# A run in which more than 5 % of the calls started over 20 ms late measured a machine too
# busy to keep the workers' schedule, not the strategy (as compare.sh's LATE_PCT): it is run
# again, up to 3 times, and the last one counts. In one such run (1,409 of 3,691 calls late,
# another test and a build beside it) per process sent 84 probes where the seeds send 64: its
# workers' probes, late, timed out and probed again.
run() {  # run STRATEGY SCOPE
  local seg=() try late=()
  for try in 1 2 3; do
    start_hosts "$fleet" "$retryd" "$scenario" "$1" "$2" "$hosts" "$dir" "$1" || fail "$1: the daemons did not start"
    seg=()
    [ -n "$host_segments" ] && seg=(--segments="$host_segments")
    "$fleet" --scenario="$scenario" --strategy="$1" --workdir="$dir" --stop_when_closed \
      --summary_csv="$dir/$1.csv" "${seg[@]}" >"$dir/$1.txt" 2>&1 || { cat "$dir/$1.txt" >&2; fail "$1: retryd_fleet failed"; }
    stop_started
    read -r -a late < <(sed -n 's/.*; \([0-9]*\) of \([0-9]*\) calls started over.*/\1 \2/p' "$dir/$1.txt")
    if [ $((100 * late[0])) -le $((5 * late[1])) ] || [ "$try" -eq 3 ]; then break; fi
    echo "$1: ${late[0]} of ${late[1]} calls started late: the machine was busy; again"
    rm -f "$dir/$1.csv"
  done
  # The run that counts, beside the other strategy's in real.csv.
  if [ -f "$dir/real.csv" ]; then tail -n +2 "$dir/$1.csv" >>"$dir/real.csv"; else cp "$dir/$1.csv" "$dir/real.csv"; fi
  grep -q "^ended at" "$dir/$1.txt" ||
    fail "$1: not every breaker had closed again by the scenario's end (the failover ended at 6 s of 40)"
}

# Through retryd: a daemon per host, one breaker per host, one probe per host.
run retryd host
tripped=$(field "$dir/real.csv" retryd breakers_tripped)
per_reopening=$(field "$dir/real.csv" retryd probes_per_reopening)
peak=$(field "$dir/real.csv" retryd peak_retries_1s) bound=$(field "$dir/real.csv" retryd retry_bound_1s)
denied=$(field "$dir/real.csv" retryd retries_denied)
read -r -a each < <(sed -n 's/^downstream: probes read from each host: \([0-9 ]*\), at most.*/\1/p' "$dir/retryd.txt")
at_once=$(sed -n 's/^downstream: probes read from each host: .*, at most \([0-9]*\) at once.*/\1/p' "$dir/retryd.txt")
echo "retryd: $tripped of $hosts breakers tripped; $per_reopening probes per reopening (each host: ${each[*]}, at most $at_once at once from one); $peak retries in the busiest second, bound $bound, $denied denied"
echo "  simulated: tripped $(field "$dir/sim.csv" retryd breakers_tripped | xargs), probes per reopening $(field "$dir/sim.csv" retryd probes_per_reopening | xargs), retries $(field "$dir/sim.csv" retryd peak_retries_1s | xargs)"
[ "$peak" -le $((bound + bound / 10 + 2)) ] || fail "retryd: $peak retries in a second, over the host budgets' bound $bound"
[ "$denied" -ge 1 ] || fail "retryd: the host budgets denied no retry"
# shellcheck disable=SC2046
within "$tripped" 0 $(field "$dir/sim.csv" retryd breakers_tripped) ||
  fail "retryd: $tripped breakers tripped; the simulator: $(field "$dir/sim.csv" retryd breakers_tripped | xargs)"
# shellcheck disable=SC2046
within "$per_reopening" 1 $(field "$dir/sim.csv" retryd probes_per_reopening) ||
  fail "retryd: $per_reopening probes per reopening; the simulator: $(field "$dir/sim.csv" retryd probes_per_reopening | xargs)"
[ "${#each[@]}" -eq "$hosts" ] || fail "retryd: the downstream counted probes from ${#each[@]} hosts, not $hosts"
for n in "${each[@]}"; do [ "$n" -ge 1 ] || fail "retryd: a host sent no probe (each host: ${each[*]})"; done
[ "$at_once" -le 1 ] || fail "retryd: $at_once probes at once from one host"

# Per process: every worker's own breaker, its own probe.
run per-process process
pp_tripped=$(field "$dir/real.csv" per-process breakers_tripped)
pp_per_reopening=$(field "$dir/real.csv" per-process probes_per_reopening)
read -r -a pp_each < <(sed -n 's/^downstream: probes read from each host: \([0-9 ]*\), at most.*/\1/p' "$dir/per-process.txt")
echo "per-process: $pp_tripped breakers tripped; $pp_per_reopening probes per reopening (each host: ${pp_each[*]})"
echo "  simulated: tripped $(field "$dir/sim.csv" per-process breakers_tripped | xargs), probes per reopening $(field "$dir/sim.csv" per-process probes_per_reopening | xargs)"
# shellcheck disable=SC2046
within "$pp_tripped" 25% $(field "$dir/sim.csv" per-process breakers_tripped) ||
  fail "per-process: $pp_tripped breakers tripped; the simulator: $(field "$dir/sim.csv" per-process breakers_tripped | xargs)"
# shellcheck disable=SC2046
within "$pp_per_reopening" 25% $(field "$dir/sim.csv" per-process probes_per_reopening) ||
  fail "per-process: $pp_per_reopening probes per reopening; the simulator: $(field "$dir/sim.csv" per-process probes_per_reopening | xargs)"
[ "${#pp_each[@]}" -eq "$hosts" ] || fail "per-process: the downstream counted probes from ${#pp_each[@]} hosts, not $hosts"
for n in "${pp_each[@]}"; do
  # shellcheck disable=SC2046
  within "$n" 25% $(field "$dir/sim.csv" per-process probes_each_host) ||
    fail "per-process: a host's workers sent $n probes (each host: ${pp_each[*]}); the simulator: $(field "$dir/sim.csv" per-process probes_each_host | xargs)"
done
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 8 * float(sys.argv[2]) else 1)" \
  "$pp_per_reopening" "$per_reopening" ||
  fail "per-process sent $pp_per_reopening probes per reopening, not 8x retryd's $per_reopening"

for st in retryd per-process; do
  echo "$st, per host (not checked):"
  python3 "$src/examples/fleet/fleet_compare.py" "$dir/real.csv" "$dir/sim.csv" --strategy="$st" 2>&1
done
echo "hosts: OK ($hosts hosts: through retryd $per_reopening probes per reopening, per process $pp_per_reopening)"
