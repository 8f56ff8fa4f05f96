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


def main():
    real, sim = load(sys.argv[1]), load(sys.argv[2])
    print("real fleet: %s runs per strategy; simulator: %s seeds. Median [worst]." % (sys.argv[3], sys.argv[4]))
    print()
    print("| strategy | runs with a pod killed | healthy again after the stall | failed user requests "
          "| peak sent, 1 s | peak read by the pods, 1 s |")
    print("|---|---|---|---|---|---|")
    for name in real:
        r, s = real[name], sim.get(name, [])
        if not s:
            continue
        print("| %s | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s |" % (
            name, kills(r), kills(s), recovery(r), recovery(s), pct(r), pct(s),
            peak(r, "peak_sent_1s"), peak(s, "peak_sent_1s"),
            peak(r, "peak_accepted_1s"), peak(s, "peak_accepted_1s")))
    print()
    print("Each cell: real / simulated.")


if __name__ == "__main__":
    main()
