#!/usr/bin/env python3
"""Prints the real fleet's figures beside the simulator's, one row per strategy (Markdown).

Usage: compare.py REAL_CSV SIM_CSV REAL_RUNS SIM_RUNS
Both files have the simulator's --summary_csv columns, one row per strategy and run.
"""
import csv
import statistics
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.setdefault(r["strategy"], []).append(r)
    return rows


def recovery(rows):
    vals = [float(r["recovery_s"]) for r in rows]
    open_ended = any(r["recovered"] == "0" for r in rows)
    worst = max(vals)
    med = statistics.median(vals)
    med_txt = ("> %.0f s" if statistics.median([0 if r["recovered"] == "1" else 1 for r in rows]) >= 0.5
               else "%.1f s") % med
    return "%s [%s%.1f s]" % (med_txt, "> " if open_ended else "", worst)


def pct(rows):
    v = [100.0 * int(r["user_failed"]) / max(1, int(r["user_requests"])) for r in rows]
    return "%.1f %%" % statistics.median(v)


def peak(rows, key):
    return "%.2fx" % statistics.median(float(r[key]) for r in rows)


def kills(rows):
    return "%d/%d" % (sum(int(r["pod_kills"]) > 0 for r in rows), len(rows))


def seconds(rows, key):
    v = [float(r[key]) for r in rows]
    return "%.1f s [%.1f s]" % (statistics.median(v), max(v))


def tripped(rows):
    return "%d of %s" % (statistics.median(int(r["breakers_tripped"]) for r in rows), rows[0]["breakers"])


def count(rows, key):
    v = [int(r[key]) for r in rows]
    return "%g [%d]" % (statistics.median(v), max(v))


def per_reopening(rows):
    if all(int(r["reopenings"]) == 0 for r in rows):
        return "- (no trip)"
    v = [float(r["probes_per_reopening"]) for r in rows if int(r["reopenings"]) > 0]
    return "%.1f [%.1f]" % (statistics.median(v), max(v))


def retries(rows):
    peak = statistics.median(int(r["peak_retries_1s"]) for r in rows)
    bound = statistics.median(int(r["retry_bound_1s"]) for r in rows)
    return "%.0f/s (%s)" % (peak, "%.0f/s" % bound if bound else "no budget")


def table(real, sim, heading, columns):
    """One row per strategy the simulator also ran: each column "real / simulated"."""
    print("| strategy | " + " | ".join(heading) + " |")
    print("|---" * (len(heading) + 1) + "|")
    for name in real:
        r, s = real[name], sim.get(name, [])
        if s:
            print("| %s | %s |" % (name, " | ".join("%s / %s" % (f(r), f(s)) for f in columns)))


def main():
    real, sim = load(sys.argv[1]), load(sys.argv[2])
    print("real fleet: %s runs per strategy; simulator: %s seeds. Median [worst]." % (sys.argv[3], sys.argv[4]))
    print()
    table(real, sim,
          ["runs with a pod killed", "healthy again after the stall", "failed user requests",
           "peak sent, 1 s", "peak read by the pods, 1 s"],
          [kills, recovery, pct, lambda x: peak(x, "peak_sent_1s"),
           lambda x: peak(x, "peak_accepted_1s")])
    print()
    print("Each cell: real / simulated.")
    if not any("breakers_tripped" in r for rows in real.values() for r in rows):
        return
    print()
    print("The breakers and the budgets (median [worst]; the real probes counted by the downstream):")
    print()
    table(real, sim,
          ["unhealthy time", "breakers that tripped", "breaker trips", "probes per reopening",
           "probes in flight at once, max", "retries sent, busiest 1 s (the budgets' bound)"],
          [lambda x: seconds(x, "unhealthy_s"), tripped, lambda x: count(x, "breaker_opened"),
           per_reopening, lambda x: count(x, "max_probes_in_flight_per_host"), retries])


if __name__ == "__main__":
    main()
