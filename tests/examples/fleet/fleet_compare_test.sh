#!/usr/bin/env bash
# The fleet on real daemons agrees with the simulator, on the scenarios of the fleet's promise:
# examples/fleet/fleet_compare.sh (one real run each, 5 seeds simulated, CHECK=1) on
# fleet_quiet_prober.toml (a quiet host opens with the fleet; a host that goes quiet cannot hold
# it open) and fleet_recovery.toml (no host trips again after the fleet's probe succeeds).
# Usage: fleet_compare_test.sh BUILD_DIR SOURCE_DIR WORKDIR
set -euo pipefail
build=$1 src=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
for s in fleet_quiet_prober fleet_recovery; do
  RUNS=1 SIM_RUNS=5 CHECK=1 "$src/examples/fleet/fleet_compare.sh" "$build" \
    "$src/bench/stampede/scenarios/$s.toml" "$dir/$s" || {
    echo "FAIL: $s: the real fleet and the simulator disagree (logs in $dir/$s)" >&2
    exit 1
  }
done
echo "fleet_compare: OK (real daemons agree with the simulator on the fleet's promise)"
