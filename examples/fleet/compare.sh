#!/usr/bin/env bash
# examples/fleet/compare.sh: the real fleet beside the simulator, on one scenario file.
#
# Runs each chosen strategy of SCENARIO on real processes (retryd_fleet against
# retryd_downstream) RUNS times, and the simulator on the same file over seeds 1..SIM_RUNS;
# then prints, per strategy, the real runs' median and worst beside the simulator's, and how
# many runs killed a pod (compare.py), and draws both in OUTDIR/compare.svg (the simulator's
# seed 1 and the first real run). Every host of the scenario is on this machine: for a
# host-scope strategy each run starts one retryd per host, each on a fresh segment of its own
# with the strategy's policy, and for a fleet-scope one the same joined to a redis-server of its
# own (daemons.sh, which waits for each daemon's ready line). With several hosts it also prints
# each strategy's per-host figures (fleet_compare.py).
#
# Usage: compare.sh BUILD_DIR SCENARIO OUTDIR [STRATEGY...]
#        (default: every strategy; a fleet-scope one only if the scenario has several hosts)
# Environment: RUNS (real runs per strategy, default 5), SIM_RUNS (default 10), LATE_PCT
# (default 2) and TRIES (default 3): a real run in which more than LATE_PCT % of the calls
# started over 20 ms late (retryd_fleet counts them) measured a machine too busy to keep the
# workers' schedule, not the strategy: it is set aside (OUTDIR/STRATEGY.RUN.late-N.txt) and run
# again, up to TRIES times; the last one counts if all were late, and is said.
# REDIS_SERVER: the store of a fleet strategy (default: redis-server on the PATH).
# Takes the scenario's duration + about 10 s per real run. Stops whatever it started on exit.
set -euo pipefail
build=$1 scenario=$2 out=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
runs=${RUNS:-5}
sim_runs=${SIM_RUNS:-10}
late_pct=${LATE_PCT:-2}
tries=${TRIES:-3}
fleet=$(find "$build" -name retryd_fleet -type f -perm -u+x | head -1)
stampede=$build/bench/stampede/retryd_stampede
retryd=$build/daemon/retryd
for b in "$fleet" "$stampede" "$retryd"; do
  [ -x "$b" ] || { echo "compare.sh: not built: $b" >&2; exit 1; }
done
mkdir -p "$out"
real_csv=$out/real.csv sim_csv=$out/sim.csv
rm -f "$real_csv" "$sim_csv"

hosts=$("$stampede" --scenario="$scenario" --print_hosts)
[[ $hosts =~ ^[0-9]+$ ]] || { echo "compare.sh: cannot read the hosts of $scenario" >&2; exit 2; }
declare -A scope
while read -r name sc; do scope[$name]=$sc; done < <("$stampede" --scenario="$scenario" --list_strategies)
strategies=("$@")
# By default every strategy; a fleet-scope one only with several hosts (one host is no fleet).
[ ${#strategies[@]} -eq 0 ] && mapfile -t strategies < <("$stampede" --scenario="$scenario" --list_strategies |
  awk -v hosts="$hosts" '$2 != "fleet" || hosts > 1 {print $1}')
for st in "${strategies[@]}"; do
  [ -n "${scope[$st]:-}" ] || { echo "compare.sh: $scenario has no strategy $st" >&2; exit 2; }
done

# shellcheck source=examples/fleet/daemons.sh
. "$here/daemons.sh"
trap stop_started EXIT

# late TXT: "LATE CALLS" of a run's output.
late() { sed -n 's/.*; \([0-9]*\) of \([0-9]*\) calls started over.*/\1 \2/p' "$1"; }
for run in $(seq "$runs"); do
  for st in "${strategies[@]}"; do
    for try in $(seq "$tries"); do
      rm -f "$out/one.csv"
      args=(--scenario="$scenario" --strategy="$st" --workdir="$out" --summary_csv="$out/one.csv"
            --seed="$run" --csv="$out/$st.$run.csv")
      start_hosts "$fleet" "$retryd" "$scenario" "$st" "${scope[$st]}" "$hosts" "$out" "$st.$run" || exit 1
      [ -n "$host_segments" ] && args+=(--segments="$host_segments")
      echo "run $run/$runs: $st" >&2
      "$fleet" "${args[@]}" >"$out/$st.$run.txt" 2>&1 || { cat "$out/$st.$run.txt" >&2; exit 1; }
      stop_started
      read -r n_late n_calls < <(late "$out/$st.$run.txt")
      if [ $((100 * n_late)) -le $((late_pct * n_calls)) ] || [ "$try" -eq "$tries" ]; then
        [ $((100 * n_late)) -le $((late_pct * n_calls)) ] ||
          echo "run $run/$runs: $st: $n_late of $n_calls calls started late in each of $tries tries; this one counts" >&2
        if [ -s "$real_csv" ]; then tail -n +2 "$out/one.csv" >>"$real_csv"; else cp "$out/one.csv" "$real_csv"; fi
        break
      fi
      echo "run $run/$runs: $st: $n_late of $n_calls calls started over 20 ms late (over $late_pct %): the machine was busy; again" >&2
      mv "$out/$st.$run.txt" "$out/$st.$run.late-$try.txt"
    done
  done
done
rm -f "$out/one.csv"
list=$(IFS=,; echo "${strategies[*]}")
"$stampede" --scenario="$scenario" --strategies="$list" --runs="$sim_runs" --runs_csv="$sim_csv" \
  >"$out/sim.txt"
# The picture: the simulation of seed 1 beside the real fleet's first run.
first=$(for st in "${strategies[@]}"; do printf '%s,' "$out/$st.1.csv"; done)
"$stampede" --scenario="$scenario" --strategies="$list" --svg="$out/compare.svg" \
  --real_csv="${first%,}" --real_summary_csv="$real_csv" >/dev/null
echo "picture: $out/compare.svg" >&2
python3 "$here/compare.py" "$real_csv" "$sim_csv" "$runs" "$sim_runs"
if [ "$hosts" -gt 1 ]; then
  for st in "${strategies[@]}"; do
    echo
    echo "$st, per host (real runs beside simulated seeds; median [range]):"
    echo
    python3 "$here/fleet_compare.py" "$real_csv" "$sim_csv" --strategy="$st"
  done
fi
