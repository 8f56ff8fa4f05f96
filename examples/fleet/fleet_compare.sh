#!/usr/bin/env bash
# examples/fleet/fleet_compare.sh: a fleet strategy of a scenario on real daemons beside the
# simulator.
#
# Each run starts a redis-server of its own on 127.0.0.1, one retryd per host of the scenario
# (each with its own segment and host id, the strategy's policy and fleet keys:
# retryd_fleet --print_config), as compare.sh does (daemons.sh: the workers start once every
# daemon has logged its ready line), and retryd_fleet with every host's workers on its host's
# daemon; then the simulator runs the same file over seeds 1..SIM_RUNS. fleet_compare.py prints
# the fleet's figures side by side (each host's first open, probes per fleet-wide reopening,
# every breaker closed after the stall, each host's attempts during the stall) and, with
# CHECK=1, exits 1 if real and simulated disagree beyond the tolerances it states, 3 if no real
# run kept the store throughout (or a daemon never joined it).
#
# Usage: fleet_compare.sh BUILD_DIR SCENARIO OUTDIR [STRATEGY]   (default: its first fleet one)
# Environment: RUNS (real runs, default 3), SIM_RUNS (default 100: the seeds' range, which a
#              real figure is judged against, must hold the model's own tails; a second or
#              two), CHECK (0 or 1), RETRYD (the daemon to run, default BUILD_DIR/daemon/retryd),
#              REDIS_SERVER (default: redis-server on the PATH).
# Takes the scenario's duration + about 10 s per real run. Stops whatever it started on exit.
set -euo pipefail
build=$1 scenario=$2 out=$3
strategy=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
runs=${RUNS:-3}
sim_runs=${SIM_RUNS:-100}
fleet=$(find "$build" -name retryd_fleet -type f -perm -u+x | head -1)
stampede=$build/bench/stampede/retryd_stampede
retryd=${RETRYD:-$build/daemon/retryd}
for b in "$fleet" "$stampede" "$retryd"; do
  [ -x "$b" ] || { echo "fleet_compare.sh: not built: $b" >&2; exit 1; }
done
mkdir -p "$out"
real_csv=$out/real.csv sim_csv=$out/sim.csv
rm -f "$real_csv" "$sim_csv"

if [ -z "$strategy" ]; then
  strategy=$("$stampede" --scenario="$scenario" --list_strategies | awk '$2 == "fleet" {print $1; exit}')
  [ -n "$strategy" ] || { echo "fleet_compare.sh: $scenario has no scope = \"fleet\" strategy" >&2; exit 2; }
fi
hosts=$("$stampede" --scenario="$scenario" --print_hosts)
[[ $hosts =~ ^[0-9]+$ ]] || { echo "fleet_compare.sh: cannot read the hosts of $scenario" >&2; exit 2; }

# shellcheck source=examples/fleet/daemons.sh
. "$here/daemons.sh"
trap stop_started EXIT

for run in $(seq "$runs"); do
  # 3: a daemon did not join the store (as with a run that lost it: exit 3, see below).
  start_hosts "$fleet" "$retryd" "$scenario" "$strategy" fleet "$hosts" "$out" "$run" || exit $?
  echo "run $run/$runs: $strategy on $hosts daemons" >&2
  "$fleet" --scenario="$scenario" --strategy="$strategy" --segments="$host_segments" --threads=16 \
    --workdir="$out" --summary_csv="$real_csv" --seed="$run" --csv="$out/$strategy.$run.csv" \
    >"$out/$strategy.$run.txt" 2>&1 || { cat "$out/$strategy.$run.txt" >&2; exit 1; }
  stop_started
done
"$stampede" --scenario="$scenario" --strategies="$strategy" --runs="$sim_runs" --runs_csv="$sim_csv" \
  >"$out/sim.txt"
python3 "$here/fleet_compare.py" "$real_csv" "$sim_csv" ${CHECK:+--check=$CHECK}
