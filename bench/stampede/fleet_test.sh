#!/usr/bin/env bash
# Checks the simulator's fleet scope (bench/stampede/fleet.h) on short runs:
#  (a) on long_stall.toml, retryd-fleet sends exactly fleet_half_open_probes probes per fleet-wide
#      reopening (1, then 2 with two leases) where host-wide retryd sends one per host, and
#      hosts that cannot trip alone trip on the fleet's window;
#  (b) with the store unreachable for the whole run, retryd-fleet's results are retryd's, figure
#      for figure and bin for bin (same seed);
#  (c) on fleet200.toml, the fleet-wide floor and burst bring 200 hosts' peak back down;
#  (d) a bad key or value in a [[store_outage]], a [[host_traffic]] or a fleet key is refused,
#      naming the file, the key, its line and its value;
#  (e) the fleet's promise over 10 seeds: a quiet host opens with busy hosts that tripped on
#      their own (fleet_quiet.toml; alone, it never opens), a host that goes quiet cannot hold
#      the fleet open (fleet_quiet_prober.toml), and no host trips again on the windows of the
#      failure once the fleet's probe succeeded (fleet_recovery.toml).
# Usage: fleet_test.sh BINARY SCENARIO_DIR WORKDIR
set -euo pipefail
bin=$1 scenarios=$(cd "$2" && pwd) dir=$3
mkdir -p "$dir"
fail() { echo "FAIL: $*" >&2; exit 1; }

# col FILE STRATEGY COLUMN: one figure of a --summary_csv file.
col() {
  awk -F, -v st="$2" -v c="$3" '
    NR == 1 { for (i = 1; i <= NF; ++i) idx[$i] = i; if (!(c in idx)) exit 2; next }
    $1 == st { print $idx[c]; found = 1 }
    END { if (!found) exit 3 }' "$1" || fail "no column $3 for $2 in $1"
}

# (a) Probes per reopening. The 8 s stall trips every breaker; 40 s covers the reopening.
"$bin" --scenario="$scenarios/long_stall.toml" --strategies=retryd,retryd-fleet --duration_s=40 \
  --summary_csv="$dir/long.csv" >"$dir/long.txt"
[[ $(col "$dir/long.csv" retryd reopenings) -eq 1 ]] || fail "retryd: expected 1 fleet-wide reopening"
[[ $(col "$dir/long.csv" retryd probes_each_reopening) == 50 ]] ||
  fail "retryd: expected 50 probes (one per host), got $(col "$dir/long.csv" retryd probes_each_reopening)"
[[ $(col "$dir/long.csv" retryd-fleet reopenings) -eq 1 ]] || fail "retryd-fleet: expected 1 reopening"
[[ $(col "$dir/long.csv" retryd-fleet probes_each_reopening) == 1 ]] ||
  fail "retryd-fleet: expected 1 probe, got $(col "$dir/long.csv" retryd-fleet probes_each_reopening)"
[[ $(col "$dir/long.csv" retryd-fleet fleet_closed) -eq 49 ]] ||
  fail "retryd-fleet: expected the 49 other hosts closed by the fleet's outcome"

# The same with two fleet leases: two probes.
cat >"$dir/two.toml" <<EOF
extends = "$scenarios/long_stall.toml"
[[strategy]]
name = "two-probes"
scope = "fleet"
backoff = "jitter"
deadline_ms = 2000
fleet_half_open_probes = 2
[strategy.policy]
retry_ratio = 0.2
min_retries_per_sec = 1
retry_burst = 10
window = "10s"
min_calls = 20
failure_rate_threshold = 50
open_for = "10s"
open_for_max = "10s"
open_jitter = "500ms"
half_open_probes = 1
close_after = 1
EOF
"$bin" --scenario="$dir/two.toml" --duration_s=40 --summary_csv="$dir/two.csv" >"$dir/two.txt"
[[ $(col "$dir/two.csv" two-probes probes_each_reopening) == 2 ]] ||
  fail "fleet_half_open_probes = 2: expected 2 probes, got $(col "$dir/two.csv" two-probes probes_each_reopening)"

# A fleet trip: with min_calls = 1000 no host's own window (64 QPS x 10 s) can trip, the
# fleet's (50 hosts) can.
sed -e 's/^name = "two-probes"/name = "fleet-trip"/' -e 's/^fleet_half_open_probes = 2/fleet_half_open_probes = 1/' \
    -e 's/^min_calls = 20/min_calls = 1000/' "$dir/two.toml" >"$dir/trip.toml"
"$bin" --scenario="$dir/trip.toml" --duration_s=40 --summary_csv="$dir/trip.csv" >"$dir/trip.txt"
[[ $(col "$dir/trip.csv" fleet-trip fleet_trips) -eq 50 ]] ||
  fail "min_calls = 1000: expected 50 trips on the fleet's window, got $(col "$dir/trip.csv" fleet-trip fleet_trips)"
[[ $(col "$dir/trip.csv" fleet-trip probes_each_reopening) == 1 ]] || fail "fleet trip: expected 1 probe"

# (b) The store unreachable from start to end: every host decides alone, as retryd does.
cat >"$dir/outage.toml" <<EOF
extends = "$scenarios/long_stall.toml"
[[store_outage]]
start_s = 0
end_s = 3600
EOF
"$bin" --scenario="$dir/outage.toml" --strategies=retryd,retryd-fleet --duration_s=40 \
  --summary_csv="$dir/outage.csv" --csv="$dir/outage_series.csv" >"$dir/outage.txt"
rows=$(tail -n +2 "$dir/outage.csv" | cut -d, -f2- | sort -u | wc -l)
[[ $rows -eq 1 ]] || fail "store down all along: retryd-fleet's figures differ from retryd's"
awk -F, 'NR > 1 { for (i = 2; i <= 6; ++i) if ($i != $(i + 5)) { print "bin " NR - 1; exit 1 } }' \
  "$dir/outage_series.csv" >/dev/null || fail "store down all along: the time series differ"

# (c) 200 hosts: the host-wide floor and burst add up; the fleet's are divided.
"$bin" --scenario="$scenarios/fleet200.toml" --strategies=retryd,retryd-fleet --duration_s=20 \
  --summary_csv="$dir/f200.csv" >"$dir/f200.txt"
awk -v h="$(col "$dir/f200.csv" retryd peak_sent_1s)" -v f="$(col "$dir/f200.csv" retryd-fleet peak_sent_1s)" \
  'BEGIN { exit !(h > 1.8 && f < 1.5) }' || fail "fleet200: expected host-wide > 1.8x and fleet < 1.5x"

# (d) Errors name the file, the key, its line and its value.
bad() {  # bad NAME EXPECTED TOML...: the scenario must be refused with EXPECTED in the message
  local name=$1 want=$2
  shift 2
  printf '%s\n' "extends = \"$scenarios/small.toml\"" "$@" >"$dir/$name.toml"
  local out rc=0
  out=$("$bin" --scenario="$dir/$name.toml" --duration_s=1 2>&1 >/dev/null) || rc=$?
  [[ $rc -eq 2 ]] || fail "$name: expected exit status 2, got $rc"
  [[ $out == *"$want"* ]] || fail "$name: expected \"$want\" in: $out"
}
bad outage_order "$dir/outage_order.toml: store_outage[0].end_s must be after start_s (10) (line 4: end_s = 5)" \
  '[[store_outage]]' 'start_s = 10' 'end_s = 5'
bad outage_typo "store_outage[0].ends is not a known key (line 4: ends = 5)" \
  '[[store_outage]]' 'start_s = 1' 'ends = 5'
bad outage_overlap "store_outage[1].start_s must not be before the end of the window before it (5) (line 6: start_s = 3)" \
  '[[store_outage]]' 'start_s = 1' 'end_s = 5' '[[store_outage]]' 'start_s = 3' 'end_s = 6'
bad outage_type "strategy[0].store_outage[0].start_s must be a number (line 6: start_s = \"soon\")" \
  '[[strategy]]' 'name = "f"' 'scope = "fleet"' '[[strategy.store_outage]]' 'start_s = "soon"' 'end_s = 3'
bad sync_range "strategy[0].sync_ms must be in [100, 60000] (line 5: sync_ms = 50)" \
  '[[strategy]]' 'name = "f"' 'scope = "fleet"' 'sync_ms = 50'
bad probes_range "strategy[0].fleet_half_open_probes must be in [1, 1000] (line 5: fleet_half_open_probes = 0)" \
  '[[strategy]]' 'name = "f"' 'scope = "fleet"' 'fleet_half_open_probes = 0'
bad floor_type "strategy[0].fleet_min_retries_per_sec must be an integer (line 5: fleet_min_retries_per_sec = 2.5)" \
  '[[strategy]]' 'name = "f"' 'scope = "fleet"' 'fleet_min_retries_per_sec = 2.5'
bad not_fleet "strategy[0].fleet_min_hosts applies only to scope = \"fleet\" (line 5: fleet_min_hosts = 3)" \
  '[[strategy]]' 'name = "f"' 'scope = "host"' 'fleet_min_hosts = 3'
bad fleet_typo "strategy[0].fleet_half_open_probe is not a known key (line 5: fleet_half_open_probe = 2)" \
  '[[strategy]]' 'name = "f"' 'scope = "fleet"' 'fleet_half_open_probe = 2'
bad caller_fleet "caller[0].scope must be \"process\" or \"host\"" \
  '[[caller]]' 'name = "c"' 'baseline_qps = 10' 'scope = "fleet"'
bad traffic_cover "[[host_traffic]] covers 2 hosts, and [fleet] hosts = 5: every host must be in exactly one entry" \
  '[[host_traffic]]' 'hosts = 2' 'qps = 10'
bad traffic_order "host_traffic[0].until_s must be after from_s (4) (line 6: until_s = 3)" \
  '[[host_traffic]]' 'hosts = 5' 'qps = 10' 'from_s = 4' 'until_s = 3'
bad traffic_qps "host_traffic[0].qps must be given" '[[host_traffic]]' 'hosts = 5'
bad traffic_both "[fleet] baseline_qps and [[host_traffic]] are both given" \
  '[fleet]' 'baseline_qps = 100' '[[host_traffic]]' 'hosts = 5' 'qps = 10'

# (e) The fleet's promise, over seeds 1..10. field ROWS_CSV COLUMN: that column of every row.
field() { awk -F, -v c="$2" 'NR == 1 { for (i = 1; i <= NF; ++i) idx[$i] = i; next } { print $idx[c] }' "$1"; }
"$bin" --scenario="$scenarios/fleet_quiet.toml" --runs=10 --runs_csv="$dir/quiet.csv" >"$dir/quiet.txt"
awk -F, 'NR > 1 && $1 == "retryd-fleet" { n++ } END { exit n != 10 }' "$dir/quiet.csv" ||
  fail "fleet_quiet: expected 10 runs of retryd-fleet"
paste -d' ' <(field "$dir/quiet.csv" strategy) <(field "$dir/quiet.csv" open_s_each_host) \
    <(field "$dir/quiet.csv" stall_sent_each_host) | awk '
  $1 == "retryd-fleet" && ($4 == "never" || $4 > 2.5 || $7 > 5) { print "fleet: " $0; bad = 1 }
  $1 == "retryd" && $4 != "never" { print "host-wide: " $0; bad = 1 }
  END { exit bad }' >&2 ||
  fail "fleet_quiet: the quiet host must open with the fleet within 2.5 s of the failure, sending at most 5 attempts into it (and, host-wide, never open)"
"$bin" --scenario="$scenarios/fleet_quiet_prober.toml" --strategies=retryd-fleet --runs=10 \
  --runs_csv="$dir/prober.csv" >"$dir/prober.txt"
field "$dir/prober.csv" closed_after_s | awk '$1 < 0 || $1 > 3.5 { bad = 1 } END { exit bad }' ||
  fail "fleet_quiet_prober: every breaker must close within open_for + 3 syncs (3.5 s) of the recovery: $(field "$dir/prober.csv" closed_after_s | tr '\n' ' ')"
"$bin" --scenario="$scenarios/fleet_recovery.toml" --strategies=retryd-fleet --runs=10 \
  --runs_csv="$dir/recovery.csv" >"$dir/recovery.txt"
field "$dir/recovery.csv" closed_after_s | sort -n | awk '
  { v[NR] = $1; if ($1 < 0 || $1 > 5) bad = 1 } END { if (v[5] > 3.5) bad = 1; exit bad }' ||
  fail "fleet_recovery: every breaker must close within 5 s of the recovery (median 3.5 s): $(field "$dir/recovery.csv" closed_after_s | tr '\n' ' ')"
echo "stampede_fleet: OK (probes per reopening, store down all along = retryd, fleet floor, errors, quiet hosts, recovery)"
