"""The real fleet (examples/fleet/): retryd_downstream plays the scenario's downstream model,
retryd_fleet runs a scenario's strategy on real processes, and both read the simulator's
scenario files (bench/stampede/scenario.h), `extends` included.

Environment: RETRYD_DOWNSTREAM, RETRYD_FLEET, RETRYD_STAMPEDE, RETRYD_DAEMON (binaries).
"""
import contextlib
import csv
import http.client
import importlib.util
import io
import os
import signal
import subprocess
import sys
import threading
import time
from unittest import mock

import pytest

DOWNSTREAM = os.environ["RETRYD_DOWNSTREAM"]
FLEET = os.environ["RETRYD_FLEET"]
STAMPEDE = os.environ["RETRYD_STAMPEDE"]
DAEMON = os.environ["RETRYD_DAEMON"]

POLICY_SEED000 = """
retry_ratio = 100
min_retries_per_sec = 1000000
retry_burst = 1000000
open_for = "10s"
open_for_max = "10s"
open_jitter = "0ms"
close_after = 1
"""


def scenario(tmp_path, name="s.toml", downstream=None, stall="", strategies=None, fleet=None):
    """Writes a small scenario; `fleet` and `downstream` override its keys ({key: TOML value})."""
    if strategies is None:
        strategies = '[[strategy]]\nname = "plain"\nmax_retries = 0\n[strategy.policy]\nmode = "disabled"\n'
    f = {"hosts": "1", "workers_per_host": "2", "baseline_qps": "40", **(fleet or {})}
    d = {"pods": "1", "threads_per_pod": "1", "service_median_ms": "50", "service_p99_ms": "60",
         "restart_jitter_ms": "0", "warmup_ms": "0", **(downstream or {})}
    table = lambda t: "".join(f"{k} = {v}\n" for k, v in t.items())
    text = f"""name = "test"
[run]
duration_s = 3
[fleet]
{table(f)}
[downstream]
{table(d)}
{stall}
{strategies}
"""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


class Downstream:
    def __init__(self, tmp_path, scenario_path, drain_s=0.5):
        self.port_file = tmp_path / "port"
        self.bins = tmp_path / "bins"
        self.proc = subprocess.Popen(
            [DOWNSTREAM, f"--scenario={scenario_path}", f"--port_file={self.port_file}",
             f"--bins={self.bins}", f"--drain_s={drain_s}"], stderr=subprocess.PIPE, text=True)
        for _ in range(200):
            if self.port_file.exists():
                break
            time.sleep(0.01)
        port, start = self.port_file.read_text().split()
        self.port, self.start = int(port), float(start)

    def get(self, headers=None, timeout=5):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request("GET", "/work", headers=headers or {})
        r = conn.getresponse()
        body = r.read()
        conn.close()
        return r.status, body

    def status(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        conn.request("GET", "/_status")
        fields = conn.getresponse().read().decode().split()
        conn.close()
        return {fields[i]: int(fields[i + 1]) for i in range(0, len(fields), 2)}

    def wait_until(self, what, predicate, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            st = self.status()
            if predicate(st):
                return st
            time.sleep(0.005)
        raise AssertionError(f"the downstream never got to: {what} (last: {self.status()})")

    def wait_for_time(self, t_s):
        """Waits until t_s seconds after the downstream's start."""
        while time.time() < self.start + t_s:
            time.sleep(0.005)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0, err
        lines = self.bins.read_text().splitlines()
        rows = [list(map(int, l.split())) for l in lines if not l.startswith("#")]
        tail = lines[-1].split()
        assert tail[:2] == ["#", "kills"], lines[-1]
        return {
            "accepted": sum(r[0] for r in rows),
            "dropped": sum(r[1] for r in rows),
            "probes": sum(r[2] for r in rows),
            "pods_up": [r[3] for r in rows],
            "kills": int(tail[2]),
            "max_probes_in_flight": int(tail[4]),
            "max_probes_in_flight_per_host": int(tail[6]),
            "probes_each_host": [int(v) for v in tail[8:]],
        }


def test_downstream_drops_what_expired_and_counts_probes(tmp_path):
    ds = Downstream(tmp_path, scenario(tmp_path))
    assert ds.get({"grpc-timeout": "0n"}) == (504, b"deadline expired\n")
    assert ds.get({"X-Retryd-Probe": "1"})[0] == 200
    assert ds.get({"grpc-timeout": "abc"})[0] == 400  # off the grammar: refused, not counted
    # One thread: B waits behind A for A's service time (40 ms or more), past its 1 ms budget,
    # and is dropped when the thread takes it from the queue.
    results = {}
    a = threading.Thread(target=lambda: results.setdefault("a", ds.get()))
    a.start()
    ds.wait_until("A in service", lambda st: st["in_service"] == 1)
    results["b"] = ds.get({"grpc-timeout": "1m"})
    a.join()
    assert results["a"][0] == 200
    assert results["b"][0] == 504
    # A generous budget is served.
    assert ds.get({"grpc-timeout": "5S"})[0] == 200
    got = ds.stop()
    assert got["accepted"] == 5
    assert got["dropped"] == 2
    assert got["probes"] == 1
    assert got["max_probes_in_flight"] == 1
    assert got["kills"] == 0


def test_downstream_counts_probes_per_host(tmp_path):
    # Several hosts on one machine: a probe's X-Retryd-Host counts it for its host too. One
    # thread serving 300 ms or more: the first probe is still in service when the others come.
    ds = Downstream(tmp_path, scenario(tmp_path, downstream={"service_median_ms": "300",
                                                             "service_p99_ms": "360"}))
    probe = lambda h: ds.get({"X-Retryd-Probe": "1", "X-Retryd-Host": str(h)})
    results = []
    a = threading.Thread(target=lambda: results.append(probe(2)))
    a.start()
    ds.wait_until("the first probe in service", lambda st: st["in_service"] == 1)
    b = threading.Thread(target=lambda: results.append(probe(2)))
    b.start()
    ds.wait_until("the second probe read", lambda st: st["read"] == 2)
    results.append(probe(0))  # one thread: it waits behind both
    a.join()
    b.join()
    assert ds.get({"X-Retryd-Host": "1"})[0] == 200  # not a probe: not counted
    got = ds.stop()
    assert [r[0] for r in results] == [200, 200, 200]
    assert got["probes"] == 3 and got["max_probes_in_flight"] == 3
    assert got["max_probes_in_flight_per_host"] == 2
    assert got["probes_each_host"] == [1, 0, 2]


def test_downstream_stall_holds_what_arrives_until_it_ends(tmp_path):
    path = scenario(tmp_path, stall="[[stall]]\nstart_s = 0.3\nduration_s = 2.0\n")
    ds = Downstream(tmp_path, path)
    ds.wait_for_time(0.5)
    sent = time.time() - ds.start
    assert sent < 2.3, f"the test itself ran late: sent at {sent:.3f} s, after the stall"
    status, _ = ds.get()
    answered = time.time() - ds.start
    assert status == 200
    assert answered >= 2.3, f"answered at {answered:.3f} s, inside the stall (0.3-2.3 s)"
    got = ds.stop()
    assert got["accepted"] == 1


def test_downstream_errors_window_answers_503_at_once(tmp_path):
    # A service time of 1 s: an answer within it was not served.
    path = scenario(tmp_path, stall='[[stall]]\nstart_s = 0.2\nduration_s = 2.0\nkind = "errors"\n',
                    downstream={"service_median_ms": "1000", "service_p99_ms": "1100"})
    ds = Downstream(tmp_path, path, drain_s=2)
    ds.wait_for_time(0.3)
    sent = time.time()
    status, _ = ds.get()
    assert status == 503
    assert time.time() - sent < 0.9, "a 503 of a failover comes at once, not after a service time"
    assert time.time() - ds.start < 2.2, "the test itself ran late, past the window"
    ds.wait_for_time(2.3)
    assert ds.get()[0] == 200
    got = ds.stop()
    assert got["accepted"] == 2 and got["kills"] == 0


def test_downstream_refused_window_resets_connections(tmp_path):
    path = scenario(tmp_path, stall='[[stall]]\nstart_s = 0.3\nduration_s = 2.0\nkind = "refused"\n')
    ds = Downstream(tmp_path, path, drain_s=2)
    kept = http.client.HTTPConnection("127.0.0.1", ds.port, timeout=5)
    kept.request("GET", "/work")
    assert kept.getresponse().read() == b"ok\n"  # an open keep-alive connection, before
    ds.wait_for_time(0.4)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        ds.get()  # a new connection
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        kept.request("GET", "/work")  # the open one
        kept.getresponse().read()
    assert time.time() - ds.start < 2.3, "the test itself ran late, past the window"
    ds.wait_for_time(2.4)
    assert ds.get()[0] == 200
    got = ds.stop()
    assert got["accepted"] == 2  # the refused ones were never read


def test_downstream_overload_kills_the_pod_which_comes_back(tmp_path):
    path = scenario(tmp_path, downstream={"overload_queue": "2", "overload_ms": "100", "restart_ms": "1500",
                                         "service_median_ms": "5000", "service_p99_ms": "5100"})
    ds = Downstream(tmp_path, path, drain_s=5)
    statuses = []
    threads = [threading.Thread(target=lambda: statuses.append(ds.get(timeout=10)[0])) for _ in range(3)]
    for t in threads:
        t.start()
    # One in service (for 5 s) and two queued: the queue held >= 2 for 100 ms, so the pod died
    # and every request it held was answered 503 at once.
    ds.wait_until("the pod killed", lambda st: st["pods_up"] == 0)
    killed = time.time()
    for t in threads:
        t.join()
    assert sorted(statuses) == [503] * 3, statuses
    assert time.time() - killed < 1.0, "what the pod held was answered at once"
    assert ds.get()[0] == 503  # no pod up: the balancer answers
    ds.wait_until("the pod back", lambda st: st["pods_up"] == 1)
    assert time.time() - killed >= 1.4  # restart_ms, from the kill
    got = ds.stop()
    assert got["kills"] == 1
    assert 0 in got["pods_up"] and got["pods_up"][-1] == 1


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_fleet_runs_a_process_strategy_with_the_simulators_figures(tmp_path):
    strategies = f"""[[strategy]]
name = "fixed"
max_retries = 3
backoff = "fixed"
fixed_ms = [50]
deadline_ms = 2000
[strategy.policy]
{POLICY_SEED000}
"""
    path = scenario(tmp_path, strategies=strategies, stall="[[stall]]\nstart_s = 1.2\nduration_s = 1.0\n",
                    downstream={"threads_per_pod": "4", "service_median_ms": "10", "service_p99_ms": "30"})
    real = tmp_path / "real.csv"
    out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=fixed", f"--workdir={tmp_path}",
                          f"--summary_csv={real}", "--threads=16"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "dropped by pods, deadline passed" in out.stdout
    sim = tmp_path / "sim.csv"
    subprocess.run([STAMPEDE, f"--scenario={path}", f"--summary_csv={sim}"], check=True,
                   capture_output=True)
    assert real.read_text().splitlines()[0] == sim.read_text().splitlines()[0]  # same columns
    (row,) = read_csv(real)
    assert row["strategy"] == "fixed"
    assert row["breakers_per_host"] == "2"
    # 40 QPS for 3 s: 120 calls expected; Poisson, 5 sigma either way.
    assert 65 <= int(row["user_requests"]) <= 175, row
    assert int(row["user_failed"]) <= int(row["user_requests"])
    assert float(row["baseline_p99_ms"]) > 0
    # The stall (1 s, twice the 500 ms timeout) fails attempts: retries were tried. A call the
    # open breaker refused sends no attempt (a loaded run's breaker can open and refuse enough
    # to bring attempts per request under 1), so the refused calls count as tried too.
    requests = int(row["user_requests"])
    tried = float(row["attempts_per_request"]) * requests + int(row["rejected_open"])
    assert tried > requests, row


def test_fleet_through_retryd_with_the_strategys_policy(tmp_path):
    strategies = f"""[[strategy]]
name = "host"
scope = "host"
max_retries = 2
backoff = "jitter"
base_ms = 50
[strategy.policy]
{POLICY_SEED000}
"""
    path = scenario(tmp_path, strategies=strategies)
    config = subprocess.run([FLEET, f"--scenario={path}", "--strategy=host", "--print_config"],
                            capture_output=True, text=True, check=True).stdout
    assert 'open_for = "10s"' in config and "close_after = 1" in config
    (tmp_path / "retryd.toml").write_text(config)
    check = subprocess.run([DAEMON, f"--check_config={tmp_path / 'retryd.toml'}"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr

    segment = f"retryd-fleet-test-{os.getpid()}"
    default = subprocess.Popen([DAEMON, f"--segment={segment}", "--tick_ms=10"],
                               stderr=subprocess.DEVNULL)
    try:
        wait_for(f"/dev/shm/{segment}")
        # The daemon's built-in policy is not the strategy's: refused, naming the knob.
        out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=host", f"--segment={segment}",
                              f"--workdir={tmp_path}"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "wants retry_ratio = 100, the retryd on segment" in out.stderr, out.stderr
    finally:
        stop(default, segment)

    daemon = subprocess.Popen([DAEMON, f"--config={tmp_path / 'retryd.toml'}", f"--segment={segment}",
                               "--tick_ms=10"], stderr=subprocess.DEVNULL)
    try:
        wait_for(f"/dev/shm/{segment}")
        real = tmp_path / "real.csv"
        out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=host", f"--segment={segment}",
                              f"--workdir={tmp_path}", f"--summary_csv={real}", "--threads=16"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        (row,) = read_csv(real)
        assert row["breakers_per_host"] == "1"
        assert 65 <= int(row["user_requests"]) <= 175, row
        assert row["pod_kills"] == "0"
    finally:
        stop(daemon, segment)


def wait_for(path):
    for _ in range(100):
        if os.path.exists(path):
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def stop(proc, segment):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    try:
        os.unlink(f"/dev/shm/{segment}")
    except FileNotFoundError:
        pass


def test_fleet_refuses_what_it_cannot_run(tmp_path):
    path = scenario(tmp_path, fleet={"hosts": "65"})
    out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=plain"], capture_output=True, text=True)
    assert out.returncode == 2 and "hosts = 65" in out.stderr, out.stderr
    path = scenario(tmp_path, name="t.toml")
    out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=nope"], capture_output=True, text=True)
    assert out.returncode == 2 and 'no strategy "nope"' in out.stderr and "plain" in out.stderr, out.stderr
    # A fleet strategy runs one daemon per host: it needs each host's segment.
    path = scenario(tmp_path, name="f.toml", fleet={"hosts": "3"},
                    strategies='[[strategy]]\nname = "f"\nscope = "fleet"\n')
    out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=f", "--segments=a,b"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "one daemon's segment per host (3), not 2" in out.stderr, out.stderr
    # So does a host strategy of several hosts: --segment names one host's.
    path = scenario(tmp_path, name="h.toml", fleet={"hosts": "3"},
                    strategies='[[strategy]]\nname = "h"\nscope = "host"\n')
    out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=h", "--segment=a"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "one daemon's segment per host (3), not 0" in out.stderr, out.stderr
    path = scenario(tmp_path, name="u.toml", downstream={"process_abandoned": "false"})
    out = subprocess.run([DOWNSTREAM, f"--scenario={path}"], capture_output=True, text=True)
    assert out.returncode == 2 and "process_abandoned" in out.stderr, out.stderr


def test_scenario_extends_another(tmp_path):
    scenario(tmp_path, name="base.toml", strategies='[[strategy]]\nname = "a"\n[[strategy]]\n'
                                                          'name = "b"\nscope = "host"\n')
    (tmp_path / "child.toml").write_text('extends = "base.toml"\nname = "child"\n[fleet]\nhosts = 7\n')
    out = subprocess.run([STAMPEDE, f"--scenario={tmp_path / 'child.toml'}", "--list_strategies"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "a process\nb host\n"
    out = subprocess.run([STAMPEDE, f"--scenario={tmp_path / 'child.toml'}", "--strategies=a"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("child: 7 hosts x 2 workers, 40 QPS"), out.stdout
    # The child's own strategies replace the base's.
    (tmp_path / "own.toml").write_text('extends = "base.toml"\n[[strategy]]\nname = "c"\n')
    out = subprocess.run([STAMPEDE, f"--scenario={tmp_path / 'own.toml'}", "--list_strategies"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "c process\n"
    # A typo in the child is an error naming the file and the key.
    (tmp_path / "typo.toml").write_text('extends = "base.toml"\n[fleet]\nhost = 7\n')
    out = subprocess.run([STAMPEDE, f"--scenario={tmp_path / 'typo.toml'}"], capture_output=True, text=True)
    assert out.returncode == 2 and "typo.toml: fleet.host is not a known key" in out.stderr, out.stderr
    # A missing base and a cycle are errors that say so.
    (tmp_path / "missing.toml").write_text('extends = "nowhere.toml"\n')
    out = subprocess.run([STAMPEDE, f"--scenario={tmp_path / 'missing.toml'}"], capture_output=True, text=True)
    assert out.returncode == 2 and 'extends "nowhere.toml"' in out.stderr and "cannot open" in out.stderr
    (tmp_path / "loop.toml").write_text('extends = "loop.toml"\n')
    out = subprocess.run([STAMPEDE, f"--scenario={tmp_path / 'loop.toml'}"], capture_output=True, text=True)
    assert out.returncode == 2 and "deep (a cycle?)" in out.stderr, out.stderr


def test_scenario_other_callers(tmp_path):
    caller = '[[caller]]\nname = "batch"\nhosts = 2\nworkers_per_host = 2\nbaseline_qps = 20\nmax_retries = 1\n'
    path = scenario(tmp_path, strategies='[[strategy]]\nname = "a"\n' + caller)
    out = subprocess.run([STAMPEDE, f"--scenario={path}", f"--summary_csv={tmp_path / 's.csv'}"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "other callers: failed requests" in out.stdout
    (row,) = read_csv(tmp_path / "s.csv")
    # 20 QPS for 3 s from the batch caller: 60 expected; Poisson, 5 sigma either way.
    assert 22 <= int(row["other_user_requests"]) <= 100, row
    # The [fleet]'s own figures are its own: 40 QPS for 3 s.
    assert 65 <= int(row["user_requests"]) <= 175, row
    # A caller needs its rate, and its keys are checked like a strategy's.
    bad = scenario(tmp_path, name="bad.toml", strategies='[[strategy]]\nname = "a"\n[[caller]]\nname = "b"\n')
    out = subprocess.run([STAMPEDE, f"--scenario={bad}"], capture_output=True, text=True)
    assert out.returncode == 2 and "caller[0].baseline_qps must be given" in out.stderr, out.stderr
    typo = scenario(tmp_path, name="typo.toml",
                    strategies='[[strategy]]\nname = "a"\n[[caller]]\nname = "b"\nbaseline_qps = 1\nretries = 2\n')
    out = subprocess.run([STAMPEDE, f"--scenario={typo}"], capture_output=True, text=True)
    assert out.returncode == 2 and "caller[0].retries is not a known key" in out.stderr, out.stderr
    # The real fleet is one caller: it says so rather than run half the scenario.
    out = subprocess.run([FLEET, f"--scenario={path}", "--strategy=a"], capture_output=True, text=True)
    assert out.returncode == 2 and "[[caller]] is simulated only" in out.stderr, out.stderr


def test_scenario_incident_kinds(tmp_path):
    for kind, read in (("errors", True), ("refused", False)):
        path = scenario(tmp_path, name=f"{kind}.toml",
                        stall=f'[[stall]]\nstart_s = 1\nduration_s = 1\nkind = "{kind}"\n')
        csv_path = tmp_path / f"{kind}.csv"
        subprocess.run([STAMPEDE, f"--scenario={path}", f"--csv={csv_path}"], check=True, capture_output=True)
        rows = read_csv(csv_path)
        during = [r for r in rows if 1.1 <= float(r["t_s"]) < 1.9]
        assert all(r["plain_user_failed_per_s"] != "0" for r in during[2:]), kind  # every call fails
        accepted = sum(float(r["plain_accepted_per_s"]) for r in during)
        assert (accepted > 0) == read, (kind, accepted)  # a refused connection is never read
    bad = scenario(tmp_path, name="bad.toml", stall='[[stall]]\nkind = "flood"\n')
    out = subprocess.run([STAMPEDE, f"--scenario={bad}"], capture_output=True, text=True)
    assert out.returncode == 2 and 'stall[0].kind must be "stall", "errors" or "refused"' in out.stderr


COMPARE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "fleet", "fleet_compare.py")


def summary_csv(path, runs):
    """A --summary_csv of two hosts, one row per run: (probes per reopening, fleet_fallbacks[,
    late calls of 1,000])."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["strategy", "open_s_each_host", "stall_sent_each_host", "probes_each_host",
                    "probes_per_reopening", "closed_after_s", "fleet_fallbacks", "calls",
                    "late_calls"])
        for probes, fallbacks, *late in runs:
            w.writerow(["fleet", "1.0 1.2", "100 90", f"{probes} 0", probes, "2.0", fallbacks,
                        1000, late[0] if late else 0])
    return str(path)


def test_fleet_compare_leaves_out_a_real_run_in_which_the_store_was_lost(tmp_path):
    sim = summary_csv(tmp_path / "sim.csv", [(3, 0), (3, 0), (4, 0)])
    compare = lambda runs: subprocess.run(
        ["python3", COMPARE, summary_csv(tmp_path / "real.csv", runs), sim, "--check=1"],
        capture_output=True, text=True)
    # Hosts that decided alone probed alone: 8 probes, named and not compared; none left: 3.
    out = compare([(8, 6)])
    assert out.returncode == 3, out
    assert "real run 1: its daemons lost the store 6 times in all" in out.stderr, out.stderr
    # The run that kept the store is compared alone.
    out = compare([(8, 6), (4, 0)])
    assert out.returncode == 0, out
    assert "real (1 runs)" in out.stdout and "real run 1:" in out.stderr and "real run 2" not in out.stderr
    # The same probes with the store kept throughout disagree.
    out = compare([(8, 0)])
    assert out.returncode == 1 and "disagree: probes per fleet-wide reopening" in out.stderr, out
    # Late calls are named, and the run still compared.
    out = compare([(8, 0, 110)])
    assert out.returncode == 1, out
    assert "real run 1: 110 of its 1000 calls started over 20 ms late" in out.stderr, out.stderr


def test_fleet_compare_finds_the_model_in_agreement_with_itself(tmp_path):
    """Each of 500 simulated seeds (101 to 600), taken as the real run, agrees with seeds
    1 to 100, the simulated side fleet_compare_test.sh gives it, on the scenarios that test
    checks: a real fleet that behaves exactly as the model does is never called a disagreement.
    Against 5 seeds, as the test once had, the simulated range missed the model's own tails
    (closing times from 0.8 to 4.6 s): one seed drawn against 5 others disagreed in 5 draws of
    300 in each scenario. Against 100, a two-sided first open still called 40 seeds of 20,000 a
    disagreement (fleet_recovery's quiet host opening as early as 1.3 s); the check is now
    one-sided, no later than the model."""
    spec = importlib.util.spec_from_file_location("fleet_compare", COMPARE)
    fleet_compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fleet_compare)
    scenarios = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "stampede", "scenarios")
    for name in ("fleet_recovery", "fleet_quiet_prober"):
        runs = tmp_path / f"{name}.csv"
        subprocess.run([STAMPEDE, f"--scenario={os.path.join(scenarios, name + '.toml')}",
                        "--strategies=retryd-fleet", "--runs=600", f"--runs_csv={runs}"],
                       check=True, capture_output=True)
        with open(runs) as f:
            reader = csv.DictReader(f)
            fields, rows = reader.fieldnames, list(reader)
        assert len(rows) == 600, (name, len(rows))

        def write(path, some):
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                w.writerows(some)
            return str(path)

        sim = write(tmp_path / "sim.csv", rows[:100])
        for i in range(100, 600):
            real = write(tmp_path / "real.csv", [rows[i]])
            out, err = io.StringIO(), io.StringIO()
            with mock.patch.object(sys, "argv", ["fleet_compare.py", real, sim, "--check=1"]), \
                    contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = fleet_compare.main()
            assert rc == 0, (name, "seed", i + 1, out.getvalue(), err.getvalue())
