#!/usr/bin/env bash
# A daemon stopped (SIGSTOP) before it logs that it is ready fails a real-fleet run within
# seconds, and leaves nothing running: examples/fleet/daemons.sh waits 10 s at most for each
# daemon's ready line, then stops what it started (SIGTERM and SIGCONT, then SIGKILL after
# 10 s). fleet_compare.sh runs fleet_quiet_prober.toml's three hosts on a "daemon" that stops
# itself, then runs the real retryd; before, the run waited for the stopped daemon forever.
# Usage: stopped_daemon_test.sh BUILD_DIR SOURCE_DIR WORKDIR
set -euo pipefail
build=$1 src=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*" >&2; exit 1; }
cat >"$dir/stopped_retryd.sh" <<STOPPED
#!/bin/sh
echo \$\$ >>"$dir/pids"
kill -STOP \$\$
exec "$build/daemon/retryd" "\$@"
STOPPED
chmod +x "$dir/stopped_retryd.sh"
start=$SECONDS rc=0
RETRYD=$dir/stopped_retryd.sh RUNS=1 SIM_RUNS=1 timeout 90 "$src/examples/fleet/fleet_compare.sh" \
  "$build" "$src/bench/stampede/scenarios/fleet_quiet_prober.toml" "$dir/out" >"$dir/log" 2>&1 || rc=$?
took=$((SECONDS - start))
left=()
while read -r p; do
  if kill -0 "$p" 2>/dev/null; then left+=("$p"); kill -KILL "$p" 2>/dev/null || true; fi
done < <(cat "$dir/pids" 2>/dev/null)
[ "$rc" != 124 ] || fail "fleet_compare.sh still waited for the stopped daemons after 90 s"
[ "$rc" != 0 ] || fail "fleet_compare.sh ran on daemons that never became ready"
grep -q "is not ready" "$dir/log" || { cat "$dir/log" >&2; fail "no word of the daemon that was not ready"; }
[ ${#left[@]} -eq 0 ] || fail "the stopped daemons ${left[*]} were left running"
echo "stopped daemon: fleet_compare.sh failed (exit $rc) after ${took}s, nothing left running"
