#!/usr/bin/env bash
# The fleet on real daemons agrees with the simulator, on the scenarios of the fleet's promise:
# examples/fleet/fleet_compare.sh (one real run each, 100 seeds simulated, CHECK=1) on
# fleet_quiet_prober.toml (a quiet host opens with the fleet; a host that goes quiet cannot hold
# it open) and fleet_recovery.toml (no host trips again after the fleet's probe succeeds).
#
# One real run is one draw of the model's outcomes, and a figure agrees when it lands within
# the tolerance of the simulated seeds' range: the range must hold the model's own tails. With
# 5 seeds it did not (the quiet host of fleet_recovery opens as early as 3.4 s in a few seeds
# of 300, against 5.2 to 5.6 s in seeds 1 to 5), and the model judged against itself disagreed
# in about one draw in 60 per scenario; with 100 seeds, in none of 300
# (test_fleet.py: test_fleet_compare_finds_the_model_in_agreement_with_itself).
#
# The scenarios assume a store that answers. A real run in which a daemon lost it (a command
# slower than the fleet's 250 ms timeout: on a loaded machine, Redis or a fleet thread kept off
# a CPU) ran hosts that decided alone for a while; fleet_compare.py names it and exits 3, and the
# scenario runs again, three times at most, each loss shown with the run's figures and the
# daemons' own lines. A loss at any moment of a run leaves the run out, even one after every
# breaker closed (the count has no time): a disagreement of such a run is not judged, which a
# loss in each of the three attempts turns into a failure. The workers start only once every
# daemon has joined the store (daemons.sh).
# Usage: fleet_compare_test.sh BUILD_DIR SOURCE_DIR WORKDIR
set -euo pipefail
build=$1 src=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
for s in fleet_quiet_prober fleet_recovery; do
  for attempt in 1 2 3; do
    out=$dir/$s.$attempt rc=0
    RUNS=1 SIM_RUNS=100 CHECK=1 "$src/examples/fleet/fleet_compare.sh" "$build" \
      "$src/bench/stampede/scenarios/$s.toml" "$out" || rc=$?
    [ "$rc" -eq 3 ] || break
    echo "$s: attempt $attempt lost the store; its figures, and what the daemons said:" >&2
    grep -hE "probes|fleet:|closed after|late" "$out"/*.1.txt >&2 || true
    grep -h "^W.*fleet: .*deciding locally" "$out"/retryd-*.log >&2 || true
  done
  [ "$rc" -eq 0 ] || {
    cat "$out"/*.1.txt >&2 || true
    grep -h "^[WE]" "$out"/retryd-*.log >&2 || true
    echo "FAIL: $s: the real fleet and the simulator disagree, or no run kept the store (logs in $out)" >&2
    exit 1
  }
done
echo "fleet_compare: OK (real daemons agree with the simulator on the fleet's promise)"
