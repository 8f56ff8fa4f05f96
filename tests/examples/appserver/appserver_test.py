#!/usr/bin/env python3
"""The stampede on a real application server, short form: examples/appserver/run.sh on
examples/appserver/short.toml (26 s, 6 s of 503s), once with the four fixes per php-fpm child
and once through retryd, then what holds however loaded the machine is:

  - the open-loop generator sent every arrival it drew, and php-fpm answered through nginx
    (none failed at the front, none unreadable; a request the starved machine did not answer
    within the generator's 10 s is reported, not failed);
  - every child had a breaker of its own per process (one dependency per child), and the host
    one through retryd, each with the strategy's policy;
  - through retryd, the downstream never had more than one probe in flight, and read no more
    probes than the host's breaker had half-open episodes, after the breaker tripped; the
    breaker closed again; the retries of the busiest second stayed within what the host's
    budget grants in a second, and the budget denied some;
  - per process, several children's breakers tripped and reopened, and the downstream read a
    probe from each: more probes than through retryd.

run.sh polls for every process it starts (a segment, a socket, "ready" in a log, every child
answering) and the generator waits for every answer, so no step depends on a fixed margin.
Exits 77 (skipped) when php-fpm, PHP's curl or nginx is not installed.

  appserver_test.py BUILD_DIR OUT_DIR
Environment: PHP_EXT (a built retryd.so: the php_extension fixture's), CHILDREN (32).
"""

import csv
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
RUN = ROOT / "examples" / "appserver" / "run.sh"
SCENARIO = ROOT / "examples" / "appserver" / "short.toml"
SKIP = 77


def skip_reason():
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    if not (shutil.which("php-fpm8.2", path=path) or shutil.which("php-fpm", path=path)):
        return "php-fpm is not installed (apt-get install php-fpm; scripts/test installs it)"
    if not shutil.which("nginx", path=path):
        return "nginx is not installed (apt-get install nginx; scripts/test installs it)"
    r = subprocess.run(["php", "-r", "exit(extension_loaded('curl') ? 0 : 1);"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        return "PHP has no curl extension (apt-get install php-curl; scripts/test installs it)"
    return None


def main():
    build, out = sys.argv[1], pathlib.Path(sys.argv[2])
    reason = skip_reason()
    if reason:
        print(f"SKIP: {reason}")
        sys.exit(SKIP)
    children = int(os.environ.get("CHILDREN", "32"))
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, RUNS="1", CHILDREN=str(children), STRATEGIES="per-process retryd")
    r = subprocess.run([str(RUN), build, str(SCENARIO), str(out)], env=env, timeout=600)
    if r.returncode != 0:
        print(f"FAIL: run.sh exited {r.returncode}")
        sys.exit(1)
    results = {}
    for line in (out / "results.txt").read_text().splitlines():
        kv = dict(item.split("=", 1) for item in line.split()[1:])
        results[kv["strategy"]] = kv
    failures = []

    def check(ok, what):
        print(("ok:   " if ok else "FAIL: ") + what)
        if not ok:
            failures.append(what)

    for st in ("per-process", "retryd"):
        if st not in results:
            print(f"FAIL: no result for {st}")
            sys.exit(1)
        r = {k: v for k, v in results[st].items()}
        n = lambda k: int(r[k])  # noqa: E731
        check(n("sent") == n("requests"),
              f"{st}: the generator sent every arrival ({r['sent']} of {r['requests']}; "
              f"{r['achieved_qps']}/s, {r['late']} over 20 ms late)")
        # A request the starved machine did not answer within the generator's timeout is the
        # load's doing (reported); one nginx failed, or an unreadable answer, is the rig's.
        check(n("front_failed") == 0 and n("bad_body") == 0 and n("no_answer") < n("sent"),
              f"{st}: php-fpm answered through nginx, none failed at the front "
              f"({r['front_failed']} failed at the front, {r['bad_body']} unreadable; "
              f"{r['no_answer']} not answered within 10 s)")
        check(r["policy_ok"] == "1", f"{st}: every breaker had the strategy's policy")

    p, d = results["per-process"], results["retryd"]
    check(int(p["breakers"]) == children,
          f"per process: one breaker per child ({p['breakers']} for {children} children)")
    check(int(d["breakers"]) == 1, f"retryd: one breaker for the host ({d['breakers']})")
    check(int(d["trips"]) >= 1 and int(d["half_opens"]) >= 1,
          f"retryd: the host's breaker tripped and reopened ({d['trips']} trips, "
          f"{d['half_opens']} half-open episodes)")
    check(int(d["max_probes_at_once"]) <= 1,
          f"retryd: at most 1 probe in flight at the downstream ({d['max_probes_at_once']})")
    check(1 <= int(d["probes"]) <= int(d["half_opens"]),
          f"retryd: at most one probe per half-open episode ({d['probes']} probes read, "
          f"{d['half_opens']} episodes)")
    check(int(d["closes"]) >= 1,
          f"retryd: the host's breaker closed again after the 503s ({d['closes']} closes)")
    # The host's budget: the retries of the busiest second within what it grants in that second,
    # and some denied (the 503s ask for more).
    rows = {r["strategy"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    b = rows["retryd"]
    peak, bound, denied = (int(b["peak_retries_1s"]), int(b["retry_bound_1s"]),
                           int(b["retries_denied"]))
    check(bound > 0 and peak <= bound * 1.1 + 2 and denied > 0,
          f"retryd: {peak} retries in the busiest second, within the budget's {bound} in it; "
          f"{denied} denied")
    check(int(p["trips"]) >= 2 and int(p["half_opens"]) >= 2,
          f"per process: several children's breakers tripped and reopened ({p['trips']} trips, "
          f"{p['half_opens']} half-open episodes)")
    check(int(p["probes"]) >= 2 and int(p["probes"]) > int(d["probes"]),
          f"per process: more probes than through retryd ({p['probes']} against {d['probes']}; "
          f"at most {p['max_probes_at_once']} at once)")
    if failures:
        print(f"appserver_test: {len(failures)} failed")
        sys.exit(1)
    print("appserver_test: passed")


if __name__ == "__main__":
    main()
