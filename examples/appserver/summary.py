#!/usr/bin/env python3
"""The side-by-side of examples/appserver/run.sh: one column per strategy, each cell the
median of its runs with every run's value in brackets, from the `RESULT key=value ...` lines
that retryd_appserver_load printed (one per run) and, given, the rows it appended to its
--summary_csv in the same order (the simulator's columns: the unhealthy time, the baseline).

  summary.py RESULTS_FILE [SUMMARY_CSV]
"""

import csv
import statistics
import sys

ROWS = [
    ("runs", None),
    ("downstream pods killed", "kills"),
    ("healthy again after the stall, s", "healthy_s"),
    ("unhealthy time from the stall on, s", "unhealthy_s"),
    ("baseline P99 of the attempts, ms", "baseline_p99_ms"),
    ("failed user requests, %", "failed_pct"),
    ("peak read by the pods, 1 s (x baseline)", "peak_read_1s"),
    ("peak sent by the children, 1 s (x baseline)", "peak_sent_1s"),
    ("probes read by the pods", "probes"),
    ("probes in flight at once, at most", "max_probes_at_once"),
    ("breakers (dependencies)", "breakers"),
    ("breaker trips, all breakers", "trips"),
    ("half-open episodes, all breakers", "half_opens"),
    ("failed at the front (nginx, not 200)", "front_failed"),
    ("generator: arrivals drawn (Poisson schedule)", "requests"),
    ("generator: arrivals sent", "sent"),
    ("generator: rate achieved, per s", "achieved_qps"),
    ("generator: sent over 20 ms late", "late"),
    ("generator: worst lateness, ms", "max_late_ms"),
    ("machine: load average (1 min) at the start", "load1"),
]


def parse(path, summary_csv=None):
    runs = {}
    order = []
    rows = []
    if summary_csv:
        with open(summary_csv) as f:
            rows = list(csv.DictReader(f))
    with open(path) as f:
        for i, line in enumerate(l for l in f if l.startswith("RESULT ")):
            kv = dict(item.split("=", 1) for item in line.split()[1:])
            if i < len(rows) and rows[i]["strategy"] == kv["strategy"]:
                kv.setdefault("unhealthy_s", rows[i]["unhealthy_s"])
                kv.setdefault("baseline_p99_ms", rows[i]["baseline_p99_ms"])
            st = kv["strategy"]
            if st not in runs:
                runs[st] = []
                order.append(st)
            runs[st].append(kv)
    return order, runs


def cell(values):
    if not values:
        return "-"
    nums = []
    for v in values:
        try:
            nums.append(float(v))
        except ValueError:
            nums.append(float("inf"))  # "never"

    def fmt(x):
        if x == float("inf"):
            return "never"
        if x == int(x):
            return str(int(x))
        return f"{x:.2f}".rstrip("0")
    med = statistics.median_low(nums)  # a value some run had, "never" included
    if len(values) == 1:
        return fmt(med)
    return f"{fmt(med)} [{' '.join(fmt(x) for x in nums)}]"


def main():
    order, runs = parse(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    if not order:
        print("summary.py: no RESULT lines", file=sys.stderr)
        sys.exit(1)
    children = runs[order[0]][0].get("children", "?")
    head = ["", *order]
    table = []
    for label, key in ROWS:
        if key is None:
            table.append([label, *(str(len(runs[st])) for st in order)])
        else:
            table.append([label, *(cell([r[key] for r in runs[st] if key in r]) for st in order)])
    widths = [max(len(row[i]) for row in [head, *table]) for i in range(len(head))]
    print(f"== side by side: php-fpm ({children} children) behind nginx; median [each run]")
    for row in [head, *table]:
        print("  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:]))]))


if __name__ == "__main__":
    main()
