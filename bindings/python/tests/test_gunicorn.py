"""gunicorn workers on one host share one segment: the real daemon on a private segment, the
real gunicorn serving gunicorn_app.py (sync and gthread workers, each with and without
--preload), and the asyncio apps: FastAPI (asgi_app.py) under gunicorn's uvicorn workers and
aiohttp (aiohttp_app.py) under its aiohttp workers, four workers each; retryctl reads what the
workers did.

Every worker is a registered process of its own; the workers trip one breaker and spend one
retry budget together, and the segment's counters sum all their calls; after the downstream
recovers, one probe reaches it while every other worker is refused; a worker killed with
SIGKILL while it holds a bulkhead lease gets it back from the daemon, which judges workers
alive by /proc in the by-name mode used here (README, Trust model).

The machine may be loaded: every condition is polled, with generous timeouts, never slept
for."""

import collections
import concurrent.futures
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time
import typing

import pytest

import retryd
from conftest import ROOT, dependency_status, retryctl_json, retryctl_path
from prefork_harness import TIMEOUT, children, poll, registered
from test_adapters import Reply, Server



class Variant(typing.NamedTuple):
    args: list
    app: str = "gunicorn_app:app"
    workers: int = 3
    module: str = ""  # what the app needs beyond gunicorn (a Debian package's module)


VARIANTS = {
    "sync": Variant(["--worker-class", "sync"]),
    "sync-preload": Variant(["--worker-class", "sync", "--preload"]),
    "gthread": Variant(["--worker-class", "gthread", "--threads", "2"]),
    "gthread-preload": Variant(["--worker-class", "gthread", "--threads", "2", "--preload"]),
    "fastapi-uvicorn": Variant(["--worker-class", "uvicorn.workers.UvicornWorker"],
                               "asgi_app:app", 4, "uvicorn"),
    "aiohttp": Variant(["--worker-class", "aiohttp.GunicornWebWorker"], "aiohttp_app:app", 4,
                       "aiohttp"),
}

CONFIG = """\
[daemon]
segment = "{segment}"
socket = ""
mode = "0600"
tick = "10ms"

[dependency.backend]
min_calls = 100000

[dependency.breaker]
min_calls = 8
failure_rate_threshold = 50
window = "1h"
open_for = "1h"
open_for_max = "1h"

[dependency.budget]
min_calls = 100000
retry_burst = 4
retry_ratio = 0
min_retries_per_sec = 0

[dependency.slow]
min_calls = 100000
bulkhead_limit = 1
bulkhead_timeout = "1h"

[dependency.probe]
min_calls = 4
failure_rate_threshold = 50
window = "1h"
open_for = "1s"
open_for_max = "1s"
open_jitter = "0ms"
close_after = 1
probe_timeout = "1h"
"""


def _binary(env_name, relative):
    path = os.environ.get(env_name)
    if path:
        return path
    for found in sorted(ROOT.glob(f"build*/{relative}")):
        return str(found)
    return None


def _gunicorn():
    for path in ("/usr/bin/gunicorn", shutil.which("gunicorn")):
        if path and os.access(path, os.X_OK):
            return path
    return None


class Gunicorn:
    """The daemon, its segment and a gunicorn serving gunicorn_app on a socket of ours."""

    def __init__(self, variant, tmp, downstream):
        self.variant = variant
        self.spec = VARIANTS[variant]
        self.tmp = tmp
        self.downstream = downstream
        self.segment = f"retryd-pytest-gunicorn-{os.getpid()}-{variant}"
        self.hold_dir = tmp / "hold"
        self.hold_dir.mkdir()
        self.daemon = self.master = None
        self._logs = []
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.listener.getsockname()[1]

    def _log(self, name):
        f = open(self.tmp / name, "w")
        self._logs.append(f)
        return f

    def start(self, daemon_binary, gunicorn):
        config = self.tmp / "retryd.toml"
        config.write_text(CONFIG.format(segment=self.segment))
        log = self._log("retryd.log")
        self.daemon = subprocess.Popen([daemon_binary, f"--config={config}"], stdout=log,
                                       stderr=log)
        poll(lambda: self.daemon.poll() is not None or self._daemon_up(),
             "the daemon to come up")
        if self.daemon.poll() is not None:
            pytest.fail("retryd exited: " + (self.tmp / "retryd.log").read_text())
        env = {k: v for k, v in os.environ.items() if not k.startswith("GUNICORN")}
        env.update({
            "RETRYD_SEGMENT": self.segment,
            "RETRYD_LIBRARY": os.path.abspath(os.environ.get("RETRYD_LIBRARY")
                                              or retryd.library_path()),
            "APP_HOLD_DIR": str(self.hold_dir),
            "APP_DOWNSTREAM": self.downstream.base,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings" / "python"),
                                           str(pathlib.Path(__file__).resolve().parent)]),
        })
        fd = self.listener.fileno()
        log = self._log("gunicorn.log")
        # The listening socket is handed over (fd://), so the port is never free for another
        # process to take between choosing it and gunicorn binding it.
        self.master = subprocess.Popen(
            [gunicorn, "--workers", str(self.spec.workers), *self.spec.args,
             "--bind", f"fd://{fd}", "--timeout", "300", "--graceful-timeout", "5",
             "--log-level", "warning", self.spec.app],
            cwd=self.tmp, env=env, pass_fds=[fd], stdout=log, stderr=log)
        self.workers()
        poll(lambda: self._answers(), "gunicorn to answer")

    def _daemon_up(self):
        try:
            return retryctl_json(self.segment, "status")["daemon"]["state"] == "up"
        except (RuntimeError, ValueError):
            return False  # no segment yet

    def _answers(self):
        if not self.alive():
            pytest.fail("gunicorn exited: " + (self.tmp / "gunicorn.log").read_text())
        try:
            return self.get("/ok", timeout=5)
        except OSError:
            return None

    def alive(self):
        return self.master is not None and self.master.poll() is None

    def workers(self):
        """The worker pids, once gunicorn runs all of them (it replaces one that died)."""
        def ready():
            if not self.alive():
                pytest.fail("gunicorn exited: " + (self.tmp / "gunicorn.log").read_text())
            kids = children(self.master.pid)
            return kids if len(kids) == self.spec.workers else None
        return poll(ready, f"{self.spec.workers} gunicorn workers")

    def get(self, path, timeout=TIMEOUT):
        """GET `path` on a connection of its own (a kept-alive one would stay with one
        worker); returns the JSON answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
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
                if time.monotonic() > end:
                    pytest.fail(f"timed out waiting for {what}; answers: {answers}")
                answers.extend(pool.map(lambda _: self.get(path), range(concurrency)))
        return answers

    def stop(self):
        (self.hold_dir / "release").touch()
        if self.master is not None and self.master.poll() is None:
            self.master.terminate()
            try:
                self.master.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.master.kill()
                self.master.wait(TIMEOUT)
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(TIMEOUT)
        # A daemon stopped by SIGTERM leaves its segment for the next one: this one is ours.
        try:
            os.unlink(f"/dev/shm/{self.segment}")
        except FileNotFoundError:
            pass
        self.listener.close()
        for f in self._logs:
            f.close()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def served(request, tmp_path_factory):
    daemon_binary = _binary("RETRYD_DAEMON", "daemon/retryd")
    gunicorn = _gunicorn()
    if daemon_binary is None:
        pytest.skip("retryd not built")
    if retryctl_path() is None:
        pytest.skip("retryctl not built")
    if gunicorn is None:
        pytest.skip("gunicorn is not installed (Debian package gunicorn)")
    try:
        retryd.library_path()
    except retryd.LibraryNotFound as e:
        pytest.skip(str(e))
    if VARIANTS[request.param].module:
        pytest.importorskip(VARIANTS[request.param].module)
    downstream = Server()
    downstream.listen()
    g = Gunicorn(request.param, tmp_path_factory.mktemp(f"gunicorn-{request.param}"), downstream)
    try:
        g.start(daemon_binary, gunicorn)
        yield g
    finally:
        g.stop()
        downstream.close()


def test_every_worker_serves_and_is_a_registered_process_of_its_own(served):
    workers = served.workers()
    answers = served.spread("/ok?sleep=0.2", lambda a: workers <= {x["pid"] for x in a},
                            "a request through every worker")
    assert all(a["outcome"] == "success" for a in answers)
    assert {a["pid"] for a in answers} <= workers
    listed = registered(served.segment)
    assert workers <= set(listed), listed
    # One registry slot each: no worker shares its parent's (or another worker's) identity.
    slots = [listed[pid]["slot"] for pid in workers]
    assert len(set(slots)) == served.spec.workers
    status = retryctl_json(served.segment, "status")
    assert status["processes"]["live"] >= served.spec.workers
    backend = dependency_status(served.segment, "backend")
    assert backend["counters"]["first_attempts"] >= len(answers)


def test_workers_share_one_breaker(served):
    workers = served.workers()

    def every_worker_refused(answers):
        return workers <= {a["pid"] for a in answers if a["outcome"] == "open"}

    answers = served.spread("/fail?sleep=0.05", every_worker_refused,
                            "every worker to find the breaker open")
    outcomes = collections.Counter(a["outcome"] for a in answers)
    assert set(outcomes) <= {"failure", "open"}
    status = dependency_status(served.segment, "breaker")
    assert status["breaker"]["state"] == "open"
    counters = status["counters"]
    assert counters["opened"] == 1
    # The segment counted every worker's calls: each admission and failure any worker
    # reported, and each refusal, in the one breaker's counters.
    assert counters["failures"] == outcomes["failure"] >= 8
    assert counters["first_attempts"] == outcomes["failure"]
    assert counters["rejected_open"] == outcomes["open"]


def test_workers_share_one_retry_budget(served):
    workers = served.workers()

    def every_worker_denied(answers):
        return workers <= {a["pid"] for a in answers if a["stop"] == "budget_empty"}

    answers = served.spread("/retry", every_worker_denied,
                            "every worker to find the retry budget empty")
    # Four tokens for the host, no refill: four retries in all, whichever workers made them.
    retries = sum(a["attempts"] - 1 for a in answers)
    assert retries == 4
    assert {a["stop"] for a in answers} <= {"budget_empty", "attempts_exhausted"}
    status = dependency_status(served.segment, "budget")
    assert status["retries"]["granted"] == 4
    assert status["retries"]["denied"] == sum(a["stop"] == "budget_empty" for a in answers)
    assert status["counters"]["first_attempts"] == len(answers)
    assert status["retry_budget"]["tokens_available"] < 1


def test_one_probe_reaches_the_recovered_downstream(served):
    """The downstream fails until the breaker trips; then it recovers, holding its first answer
    2 s: that request is the probe, and the requests the workers get meanwhile are refused as
    half-open busy, none sent."""
    hold = 2.0
    downstream = served.downstream
    downstream.script("/probe", Reply(500, b"down"))
    workers = served.workers()
    served.spread("/probe", lambda a: any(x["outcome"] == "open" for x in a),
                  "the workers to trip the breaker")
    tripped = len(downstream.requests_to("/probe"))
    downstream.script("/probe", Reply(200, b"up", delay=hold), Reply(200, b"up"))
    poll(lambda: dependency_status(served.segment, "probe")["breaker"]["half_open_in_ms"] == 0,
         "the open period to end")

    first = {}
    thread = threading.Thread(target=lambda: first.update(served.get("/probe")), daemon=True)
    thread.start()
    poll(lambda: len(downstream.requests_to("/probe")) > tripped, "the probe to arrive")
    probe_at = downstream.requests_to("/probe")[tripped]["time"]
    concurrency = 2 * served.spec.workers
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        def timed(_):
            answer = served.get("/probe")
            return answer, time.monotonic()
        burst = list(pool.map(timed, range(concurrency)))
    thread.join(TIMEOUT)
    assert first["outcome"] == "success", first
    # Answered while the probe was out: refused, nothing sent.
    while_out = [a for a, at in burst if at < probe_at + hold]
    assert while_out and all(a["outcome"] == "half_open_busy" for a in while_out), burst
    assert {a["pid"] for a, _ in burst} | {first["pid"]} <= workers
    arrived = downstream.requests_to("/probe")[tripped:]
    assert [r for r in arrived if r["time"] < probe_at + hold] == arrived[:1]
    status = dependency_status(served.segment, "probe")
    assert status["breaker"]["state"] == "closed"
    assert status["rejections"]["half_open_busy"] >= len(while_out)


def test_killed_worker_gives_its_lease_back(served):
    workers = served.workers()
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
    assert dependency_status(served.segment, "slow")["bulkhead"]["in_use"] == 1
    assert registered(served.segment)[holder]["bulkhead_leases"] == 1
    # The host-wide bulkhead of one is full for every worker.
    assert served.get("/hold?hold=0")["outcome"] == "bulkhead_full"
    reclaimed = dependency_status(served.segment, "slow")["counters"]["leases_reclaimed_dead"]

    os.kill(holder, signal.SIGKILL)
    poll(lambda: dependency_status(served.segment, "slow")["bulkhead"]["in_use"] == 0,
         "the daemon to free the dead worker's lease")
    slow = dependency_status(served.segment, "slow")
    assert slow["counters"]["leases_reclaimed_dead"] == reclaimed + 1
    poll(lambda: holder not in registered(served.segment), "the dead worker to leave the registry")
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert errors, "the killed worker's request should have failed"
    # gunicorn replaces the worker, and the lease is there for any worker to take.
    assert holder not in served.workers()
    marker.unlink()
    assert served.get("/hold?hold=0")["outcome"] == "success"
