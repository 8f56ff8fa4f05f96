"""uWSGI workers on one host share one segment: the real daemon on a private segment, the real
uWSGI (`--master --processes 4`, with and without `--lazy-apps`) serving uwsgi_app.py on a
Unix socket, a downstream HTTP server in this process counting the requests the workers send,
and retryctl reading what the workers did.

Without --lazy-apps the master imports the app, and its Client, before it forks the workers:
the case that tests the client's fork safety. With it, each worker imports the app itself.
Either way the workers trip one breaker together, are granted the host's four retry tokens in
all, send exactly one probe when the breaker's open period ends, and a worker killed with
SIGKILL while it holds the host's one bulkhead lease has it given back by the daemon.

The machine may be loaded: every condition is polled, with generous timeouts, never slept
for.
"""

import collections
import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

import retryd
from conftest import ROOT, retryctl_json
from prefork_harness import (
    TIMEOUT, Daemon, Downstream, children, poll, require_daemon, stop_process)

WORKERS = 4

VARIANTS = {
    "prefork": [],
    "lazy-apps": ["--lazy-apps"],
}


def _uwsgi():
    for path in (os.environ.get("RETRYD_UWSGI"), "/usr/bin/uwsgi", shutil.which("uwsgi")):
        if path and os.access(path, os.X_OK):
            return path
    return None


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


class UWSGI:
    """The daemon, the downstream, and uWSGI serving uwsgi_app on a Unix socket of ours."""

    def __init__(self, variant, tmp):
        self.variant = variant
        self.tmp = tmp
        self.hold_dir = tmp / "hold"
        self.hold_dir.mkdir()
        self.socket = str(tmp / "http.sock")
        self.daemon = Daemon(tmp, f"retryd-pytest-uwsgi-{os.getpid()}-{variant}")
        self.downstream = Downstream()
        self.master = None
        self._log = None

    def start(self, daemon_binary, uwsgi):
        self.daemon.start(daemon_binary)
        env = {k: v for k, v in os.environ.items() if not k.startswith("UWSGI")}
        env.update({
            "RETRYD_SEGMENT": self.daemon.segment,
            "RETRYD_LIBRARY": os.path.abspath(os.environ.get("RETRYD_LIBRARY")
                                              or retryd.library_path()),
            "APP_DOWNSTREAM": self.downstream.url,
            "APP_HOLD_DIR": str(self.hold_dir),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings" / "python"),
                                           os.path.dirname(os.path.abspath(__file__))]),
        })
        self._log = open(self.tmp / "uwsgi.log", "w")
        self.master = subprocess.Popen(
            [uwsgi, "--plugin", "python3", "--master", "--processes", str(WORKERS),
             *VARIANTS[self.variant], "--http-socket", self.socket, "--module", "uwsgi_app",
             "--die-on-term", "--disable-logging", "--harakiri", "300"],
            cwd=self.tmp, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        workers = self.workers()
        poll(self._answers, "uWSGI to answer")
        # Every worker serves before a test begins. With --lazy-apps each imports the app after
        # its fork and accepts only then: on a loaded machine one worker served a test's whole
        # burst of failures while the others were still importing, and the failures that
        # tripped the shared breaker all came from it.
        self.spread("/idle?sleep=0.05", lambda answers: workers <= {a["pid"] for a in answers},
                    "every uWSGI worker to serve")

    def _answers(self):
        if not self.alive():
            pytest.fail("uwsgi exited: " + (self.tmp / "uwsgi.log").read_text())
        try:
            return self.get("/hold?hold=0", timeout=5)
        except OSError:
            return None

    def alive(self):
        return self.master is not None and self.master.poll() is None

    def workers(self):
        """The worker pids, once uWSGI runs all of them (the master replaces one that died)."""
        def ready():
            if not self.alive():
                pytest.fail("uwsgi exited: " + (self.tmp / "uwsgi.log").read_text())
            kids = children(self.master.pid)
            return kids if len(kids) == WORKERS else None
        return poll(ready, f"{WORKERS} uWSGI workers")

    def get(self, path, timeout=TIMEOUT):
        """GET `path` on a connection of its own; returns the JSON answer."""
        conn = UnixHTTPConnection(self.socket, timeout)
        try:
            conn.request("GET", path, headers={"Connection": "close"})
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200, (response.status, body)
            return json.loads(body)
        finally:
            conn.close()

    def spread(self, path, until, what, concurrency=6):
        """GETs `path` in concurrent bursts (a busy worker leaves the next connection to
        another) until until(answers) is true; returns every answer."""
        answers = []
        end = time.monotonic() + TIMEOUT
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            while not until(answers):
                if not self.alive():
                    pytest.fail("uwsgi exited: " + (self.tmp / "uwsgi.log").read_text())
                if time.monotonic() > end:
                    by_worker = collections.Counter((a["pid"], a["outcome"]) for a in answers)
                    silent = sorted(set(children(self.master.pid)) - {a["pid"] for a in answers})
                    pytest.fail(f"timed out waiting for {what}: {len(answers)} answers, by worker "
                                f"and outcome {dict(by_worker)}; workers that answered none: "
                                f"{silent}")
                answers.extend(pool.map(lambda _: self.get(path), range(concurrency)))
        return answers

    def stop(self):
        (self.hold_dir / "release").touch()
        self.downstream.release()
        stop_process(self.master)
        self.daemon.stop()
        self.downstream.close()
        if self._log is not None:
            self._log.close()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def served(request, tmp_path_factory):
    daemon_binary = require_daemon()
    uwsgi = _uwsgi()
    if uwsgi is None:
        pytest.skip("uwsgi is not installed (Debian packages uwsgi, uwsgi-plugin-python3)")
    u = UWSGI(request.param, tmp_path_factory.mktemp(f"uwsgi-{request.param}"))
    try:
        u.start(daemon_binary, uwsgi)
        yield u
    finally:
        u.stop()


def registered(segment):
    """{pid: entry} of the live processes `retryctl workers` lists."""
    return {w["pid"]: w for w in retryctl_json(segment, "workers")["workers"]
            if w["state"] == "live"}


def test_workers_share_one_breaker(served):
    workers = served.workers()
    served.downstream.set("breaker", status=503)

    def every_worker_refused(answers):
        return workers <= {a["pid"] for a in answers if a["outcome"] == "open"}

    answers = served.spread("/breaker?sleep=0.05", every_worker_refused,
                            "every worker to find the breaker open")
    outcomes = collections.Counter(a["outcome"] for a in answers)
    assert set(outcomes) <= {"failure", "open"}
    # The workers failed together: the failures that tripped it came from more than one, and
    # the downstream saw exactly the attempts the host admitted.
    assert len({a["pid"] for a in answers if a["outcome"] == "failure"}) > 1
    status = served.daemon.dep("breaker")
    assert status["breaker"]["state"] == "open"
    counters = status["counters"]
    assert counters["opened"] == 1
    assert counters["failures"] == outcomes["failure"] == served.downstream.count("breaker") >= 8
    assert counters["first_attempts"] == outcomes["failure"]
    assert counters["rejected_open"] == outcomes["open"]
    # Every worker is a registered process of its own, not its master's.
    listed = registered(served.daemon.segment)
    assert workers <= set(listed), listed
    assert len({listed[pid]["slot"] for pid in workers}) == WORKERS


def test_workers_share_one_retry_budget(served):
    workers = served.workers()
    served.downstream.set("budget", status=503)

    def every_worker_denied(answers):
        return workers <= {a["pid"] for a in answers if a["outcome"] == "budget_empty"}

    answers = served.spread("/budget?sleep=0.05", every_worker_denied,
                            "every worker to find the retry budget empty")
    # Four tokens for the host, no refill: four retries in all, whichever workers made them,
    # and the downstream received each request's first attempt and those four retries.
    retries = sum(a["attempts"] - 1 for a in answers)
    assert retries == 4
    assert served.downstream.count("budget") == len(answers) + 4
    assert {a["outcome"] for a in answers} == {"budget_empty"}
    status = served.daemon.dep("budget")
    assert status["retries"]["granted"] == 4
    assert status["retries"]["denied"] == len(answers)
    assert status["counters"]["first_attempts"] == len(answers)
    assert status["retry_budget"]["tokens_available"] < 1


def test_one_probe_after_recovery(served):
    workers = served.workers()
    downstream = served.downstream
    downstream.set("probe", status=503)
    served.spread("/probe?sleep=0.05",
                  lambda _: served.daemon.dep("probe")["breaker"]["state"] == "open",
                  "the probe breaker to open")
    # Every request has been answered: nothing is in flight, and nothing is admitted until
    # more come.
    status = served.daemon.dep("probe")
    assert status["breaker"]["probes_in_flight"] == 0
    before = status["counters"]
    sent_before = downstream.count("probe")
    # The downstream is back, and holds each request it gets until released.
    downstream.set("probe", status=200, hold=True)
    busy = set()
    with concurrent.futures.ThreadPoolExecutor(WORKERS + 2) as pool:
        pending = set()
        end = time.monotonic() + TIMEOUT
        while not (downstream.held("probe") >= 1 and len(busy) >= WORKERS - 1):
            if time.monotonic() > end:
                pytest.fail("timed out waiting for the probe to reach the downstream and the "
                            f"other workers to be refused; refused: {busy}")
            while len(pending) < WORKERS + 1:
                pending.add(pool.submit(served.get, "/probe?sleep=0.05"))
            done, pending = concurrent.futures.wait(
                pending, timeout=0.05, return_when=concurrent.futures.FIRST_COMPLETED)
            for f in done:
                answer = f.result()
                assert answer["outcome"] in ("open", "half_open_busy"), answer
                if answer["outcome"] == "half_open_busy":
                    busy.add(answer["pid"])
        # Every request but the held one is answered.
        poll(lambda: sum(not f.done() for f in pending) <= downstream.held("probe"),
             "the requests that are not held to be answered")
        # The open period ended with four workers taking requests, and one went out.
        assert downstream.count("probe") - sent_before == 1
        assert downstream.held("probe") == 1
        status = served.daemon.dep("probe")
        assert status["breaker"]["state"] == "half-open"
        assert status["breaker"]["probes_in_flight"] == 1
        (held,) = [f for f in pending if not f.done()]
        downstream.release()
        probe = held.result(TIMEOUT)
    assert probe["outcome"] == "success"
    assert probe["pid"] not in busy
    assert busy | {probe["pid"]} == workers
    status = poll(lambda: (lambda s: s if s["breaker"]["state"] == "closed" else None)(
        served.daemon.dep("probe")), "the probe breaker to close")
    after = status["counters"]
    assert after["probes_granted"] - before["probes_granted"] == 1
    assert after["closed"] - before["closed"] == 1
    assert downstream.count("probe") - sent_before == 1
    # And every worker is served again.
    served.spread("/probe?sleep=0.05",
                  lambda a: workers <= {x["pid"] for x in a if x["outcome"] == "success"},
                  "every worker to succeed again")


def test_killed_worker_gives_its_lease_back(served):
    workers = before = served.workers()
    errors = []

    def slow_request():
        try:
            served.get("/hold?hold=1", timeout=TIMEOUT * 2)
        except (OSError, http.client.HTTPException) as e:
            errors.append(e)  # the worker is killed while it serves this

    thread = threading.Thread(target=slow_request, daemon=True)
    thread.start()
    marker = poll(lambda: next(served.hold_dir.glob("hold-*"), None),
                  "a worker to hold the bulkhead lease")
    holder = int(marker.read_text())
    assert holder in workers
    segment = served.daemon.segment
    assert served.daemon.dep("slow")["bulkhead"]["in_use"] == 1
    assert registered(segment)[holder]["bulkhead_leases"] == 1
    # The host-wide bulkhead of one is full for every worker.
    assert served.get("/hold?hold=0")["outcome"] == "bulkhead_full"
    reclaimed = served.daemon.dep("slow")["counters"]["leases_reclaimed_dead"]

    os.kill(holder, signal.SIGKILL)
    poll(lambda: served.daemon.dep("slow")["bulkhead"]["in_use"] == 0,
         "the daemon to free the dead worker's lease")
    slow = served.daemon.dep("slow")
    assert slow["counters"]["leases_reclaimed_dead"] == reclaimed + 1
    poll(lambda: holder not in registered(segment), "the dead worker to leave the registry")
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert errors, "the killed worker's request should have failed"
    # The master replaces the worker, and the lease is there for any worker to take.
    workers = served.workers()
    assert holder not in workers
    marker.unlink()
    assert served.get("/hold?hold=0")["outcome"] == "success"
    # The replacement serves too. (Waiting for it also keeps the master's stop from finding it
    # still loading the app with --lazy-apps, when it misses the master's signal and the stop
    # takes uWSGI's 60 s of mercy.)
    (replacement,) = workers - before
    served.spread("/breaker?sleep=0.05", lambda a: replacement in {x["pid"] for x in a},
                  "the new worker to serve")
