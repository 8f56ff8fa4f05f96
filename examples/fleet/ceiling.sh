#!/usr/bin/env bash
# examples/fleet/ceiling.sh: how much the real fleet's rig (retryd_fleet's workers and
# retryd_downstream on this machine) can drive before it, and not the modelled pods, shapes the
# load. Runs loopback.toml's workers with no incident against pods with no limit to speak of
# (10,000 threads, 1 ms service) at rising rates, and prints per rate the calls made, the
# attempts' P99 and the calls that started late (the workers lacked threads or CPU).
#
# Usage: ceiling.sh BUILD_DIR OUTDIR [QPS...]   (default: 200 400 800 1600 3200)
set -euo pipefail
build=$1 out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
rates=("$@")
[ ${#rates[@]} -eq 0 ] && rates=(200 400 800 1600 3200)
fleet=$(find "$build" -name retryd_fleet -type f -perm -u+x | head -1)
[ -x "$fleet" ] || { echo "ceiling.sh: not built: retryd_fleet" >&2; exit 1; }
mkdir -p "$out"
printf '%8s %12s %10s %12s\n' "QPS" "calls/s" "P99 (ms)" "late calls"
for qps in "${rates[@]}"; do
  cat >"$out/ceiling.toml" <<TOML
extends = "$here/../../bench/stampede/scenarios/loopback.toml"
name = "ceiling"
[run]
duration_s = 10
[fleet]
baseline_qps = $qps
[downstream]
pods = 1
threads_per_pod = 10000
service_median_ms = 1
service_p99_ms = 3
[[stall]]
start_s = 9
duration_s = 0
TOML
  "$fleet" --scenario="$out/ceiling.toml" --strategy=no-retry --workdir="$out" >"$out/ceiling.$qps.txt" 2>&1 ||
    { cat "$out/ceiling.$qps.txt" >&2; exit 1; }
  awk -v qps="$qps" '
    /baseline P99/ { for (i = 1; i <= NF; ++i) if ($i == "P99") p99 = $(i + 1) }
    match($0, /[0-9]+ of [0-9]+ calls started/) {
      split(substr($0, RSTART, RLENGTH), w, " "); late = w[1]; calls = w[3]
    }
    END { printf "%8d %12.0f %10s %12s\n", qps, calls / 10, p99, late }' "$out/ceiling.$qps.txt"
done
