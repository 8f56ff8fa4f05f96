#!/usr/bin/env bash
# Runs retryd_stampede on a small scenario and checks that it is deterministic (the same seed
# gives the same CSV, byte for byte; another seed does not) and that its figures are sane.
# Usage: stampede_test.sh BINARY SCENARIO WORKDIR
set -euo pipefail
bin=$1 scenario=$2 dir=$3
mkdir -p "$dir"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin" --scenario="$scenario" --csv="$dir/a.csv" --summary_csv="$dir/a_summary.csv" --svg="$dir/a.svg" >"$dir/a.txt"
"$bin" --scenario="$scenario" --csv="$dir/b.csv" --summary_csv="$dir/b_summary.csv" >"$dir/b.txt"
"$bin" --scenario="$scenario" --seed=12345 --csv="$dir/c.csv" >"$dir/c.txt"

cmp -s "$dir/a.csv" "$dir/b.csv" || fail "same seed, different time series"
cmp -s "$dir/a_summary.csv" "$dir/b_summary.csv" || fail "same seed, different figures"
cmp -s "$dir/a.csv" "$dir/c.csv" && fail "a different seed gave the same time series"

bins=$(($(wc -l <"$dir/a.csv") - 1))
[[ $bins -eq 200 ]] || fail "expected 200 bins of 100 ms in 20 s, got $bins"
grep -q '</svg>' "$dir/a.svg" || fail "SVG not complete"

# One row per strategy; every figure in range.
awk -F, '
  NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
  {
    name = $col["strategy"]; ++rows
    if ($col["peak_accepted_100ms"] <= 0 || $col["peak_sent_1s"] <= 0) bad = bad " " name ":peak<=0"
    if ($col["peak_sent_1s"] > 4.5) bad = bad " " name ":peak_sent_1s>4.5"
    if ($col["baseline_p99_ms"] < 30 || $col["baseline_p99_ms"] > 90) bad = bad " " name ":baseline_p99"
    if ($col["user_failed"] > $col["user_requests"]) bad = bad " " name ":failed>requests"
    if ($col["user_requests"] < 7000 || $col["user_requests"] > 9000) bad = bad " " name ":requests"
    if ($col["attempts_per_request"] < 0.5 || $col["attempts_per_request"] > 4) bad = bad " " name ":attempts"
    if ($col["breakers_per_host"] == 1 && $col["max_probes_in_flight_per_host"] > 1) bad = bad " " name ":probes"
    if ($col["recovery_s"] < 0) bad = bad " " name ":recovery"
    # The busiest second of retries never exceeds what the budgets can grant in it.
    if ($col["retry_bound_1s"] > 0 && $col["peak_retries_1s"] > $col["retry_bound_1s"]) bad = bad " " name ":retries>bound"
    if ($col["breakers_tripped"] > $col["breakers"]) bad = bad " " name ":tripped>breakers"
    sent[name] = $col["peak_sent_1s"]
    dropped[name] = $col["dropped_expired"]
  }
  END {
    if (rows != 4) bad = bad " rows=" rows
    # Only a strategy that sends a deadline can have requests dropped for it.
    if (dropped["naive"] != 0 || dropped["seed000"] != 0 || dropped["retryd"] != 0) bad = bad " dropped_without_deadline"
    if (!(sent["naive"] > sent["retryd"])) bad = bad " naive<=retryd"
    if (bad != "") { print "FAIL:" bad > "/dev/stderr"; exit 1 }
  }' "$dir/a_summary.csv"
echo "stampede_small: OK ($bins bins, 4 strategies, deterministic)"
