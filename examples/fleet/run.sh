#!/usr/bin/env bash
# examples/fleet/run.sh: one real-fleet run on loopback. Starts the downstream (downstream.py,
# stalling at 5 s for 1.4 s), runs retryd_fleet against it, and prints both sides' figures.
#
# Usage: run.sh FLEET_BINARY SEGMENT LABEL OUTDIR [extra retryd_fleet flags...]
#   SEGMENT  the retryd segment the workers use; a name with no segment behind it gives
#            per-process limits (every worker falls back to its own private state).
# Environment: FLEET_DURATION_S (default 25), FLEET_QPS (200), FLEET_WORKERS (8),
#   FLEET_STATUS_CMD (a command run every second during the run, e.g. retryctl status).
set -euo pipefail
fleet=$1 segment=$2 label=$3 out=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
duration=${FLEET_DURATION_S:-25}
qps=${FLEET_QPS:-200}
workers=${FLEET_WORKERS:-8}
stall_at=5 stall_s=1.4
mkdir -p "$out"
rm -f "$out/$label.port"

python3 "$here/downstream.py" --port_file="$out/$label.port" --duration_s="$duration" \
  --stall_at_s=$stall_at --stall_s=$stall_s --baseline_qps="$qps" --label="$label" \
  --out="$out/$label.downstream.json" >"$out/$label.downstream.txt" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$out/$label.port" ] && break; sleep 0.05; done
[ -s "$out/$label.port" ] || { echo "downstream did not start" >&2; cat "$out/$label.downstream.txt" >&2; exit 1; }
read -r port start <"$out/$label.port"

status_loop=""
if [ -n "${FLEET_STATUS_CMD:-}" ]; then
  ( while sleep 1; do eval "$FLEET_STATUS_CMD" || true; done ) &
  status_loop=$!
fi
"$fleet" --port="$port" --start_unix_s="$start" --segment="$segment" --label="$label" \
  --duration_s="$duration" --qps="$qps" --workers="$workers" --stall_at_s=$stall_at \
  --stall_s=$stall_s --workdir="$out" "$@" >"$out/$label.fleet.txt"
[ -n "$status_loop" ] && { kill "$status_loop" 2>/dev/null || true; wait "$status_loop" 2>/dev/null || true; }
kill -TERM "$server" 2>/dev/null || true
wait "$server" 2>/dev/null || true
trap - EXIT
cat "$out/$label.fleet.txt" "$out/$label.downstream.txt"
