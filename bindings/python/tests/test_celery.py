"""retryd.celery: Celery tasks whose executions the host admits and whose retries its budget
pays for.

First the Task's rules, on real segments with Celery's eager mode (each retry executed at
once, in this process): the attempt number is `self.request.retries`, a refusal fails the task
with TaskRejected without running the body, the countdown is the policy's backoff with jitter
merged with Retry-After, what is not retryable is not retried, and what the module cannot
honour is refused when Celery makes the task.

Then a real Celery worker (`--pool prefork --concurrency 4`) on a real Redis broker (a private
redis-server on a Unix socket), the real daemon on a private segment, and a downstream HTTP
server in this process counting the requests the tasks send (celery_app.py). The four pool
processes, forked after the app (and its Client) was imported, trip one breaker together, are
granted the host's four retry tokens in all, send exactly one probe when the breaker's open
period ends, and a pool process killed with SIGKILL while it holds the host's one bulkhead
lease has it given back by the daemon.

The machine may be loaded: every condition is polled, with generous timeouts, never slept
for.
"""

import email.message
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import urllib.error

import pytest

celery = pytest.importorskip("celery")
redis = pytest.importorskip("redis")

import retryd  # noqa: E402
import retryd.celery  # noqa: E402
from conftest import ROOT, retryctl_json  # noqa: E402
from prefork_harness import (  # noqa: E402
    Daemon, Downstream, children, poll, require_daemon, stop_process)

POOL = 4


# ---- the Task's rules, in eager mode ---------------------------------------------------------

@pytest.fixture
def eager():
    app = celery.Celery("retryd_test_eager", set_as_current=False)
    app.conf.task_always_eager = True
    return app


@pytest.fixture
def retries():
    """The countdown of every retry, in order, as Celery's task_retry signal reports it."""
    seen = []

    def on_retry(request=None, reason=None, **_):
        seen.append(reason.when)

    celery.signals.task_retry.connect(on_retry, weak=False)
    yield seen
    celery.signals.task_retry.disconnect(on_retry)


def _client(seg):
    return retryd.Client(segment=seg.name, fallback_to_local=False)


def _http_error(status, retry_after=None):
    headers = email.message.Message()
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return urllib.error.HTTPError("http://downstream/x", status, "status", headers,
                                  io.BytesIO(b""))


@pytest.fixture
def failures():
    """The exception of every failed task, as raised (an eager result holds an exception that
    does not pickle, urllib's HTTPError, only as an opaque wrapper)."""
    seen = []

    def on_failure(exception=None, **_):
        seen.append(exception)

    celery.signals.task_failure.connect(on_failure, weak=False)
    yield seen
    celery.signals.task_failure.disconnect(on_failure)


def _outcome(result, failures):
    """An eager task's value, or the exception it failed with."""
    return failures[-1] if result.state == "FAILURE" else result.result


def test_each_execution_is_admitted_as_its_attempt_number(make_segment, eager):
    seg = make_segment(dep={"min_calls": 1000, "retry_burst": 2, "retry_ratio": 0,
                            "min_retries_per_sec": 0})
    dep = _client(seg).dependency("dep")
    executions = []

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=5, jitter="none", base=0.01))
    def fetch(self):
        executions.append(self.request.retries)
        raise ConnectionRefusedError("downstream down")

    result = fetch.apply()
    # Attempt 0, then the two retries the host's two tokens pay for; the third is refused
    # before its body runs, and the task fails with the refusal.
    assert executions == [0, 1, 2]
    assert result.state == "FAILURE"
    rejected = result.result
    assert isinstance(rejected, retryd.celery.TaskRejected)
    assert isinstance(rejected, retryd.Rejected)
    assert (rejected.reason, rejected.dependency, rejected.attempt) == ("budget_empty", "dep", 3)
    assert str(rejected) == "dep: retry 3 rejected: budget_empty"
    assert fetch.max_retries == 4


def test_a_breaker_refusal_fails_the_task_without_running_it(make_segment, eager, failures):
    seg = make_segment(dep={"min_calls": 2, "failure_rate_threshold": 50, "open_for": "60s",
                            "open_for_max": "60s"})
    dep = _client(seg).dependency("dep")
    executions = []

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=1))
    def fetch(self):
        executions.append(self.request.retries)
        raise _http_error(503)

    for _ in range(2):
        assert isinstance(_outcome(fetch.apply(), failures), urllib.error.HTTPError)
    assert seg.state("dep") == "open"
    result = fetch.apply()
    assert len(executions) == 2
    assert result.state == "FAILURE"
    assert isinstance(result.result, retryd.celery.TaskRejected)
    assert (result.result.reason, result.result.attempt) == ("open", 0)
    assert str(result.result) == "dep: first attempt rejected: open"


def test_the_countdown_is_the_policys_backoff(make_segment, eager, retries, failures):
    seg = make_segment(dep={"min_calls": 1000, "retry_burst": 100})
    dep = _client(seg).dependency("dep")

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=5, jitter="none", base=0.01, cap=0.03))
    def exact(self):
        raise ConnectionRefusedError()

    assert isinstance(_outcome(exact.apply(), failures), ConnectionRefusedError)
    # min(cap, base * 2^n) for the n retries before: no jitter, no Retry-After.
    assert retries == pytest.approx([0.01, 0.02, 0.03, 0.03])

    retries.clear()

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=9, jitter="full", base=0.1, cap=10))
    def full(self):
        raise ConnectionRefusedError()

    full.apply()
    assert len(retries) == 8
    for n, wait in enumerate(retries):
        assert 0 <= wait <= 0.1 * 2**n
    assert len(set(retries)) == 8, "full jitter drew the same wait twice"


def test_decorrelated_jitter_grows_from_the_previous_backoff(make_segment, eager, retries):
    seg = make_segment(dep={"min_calls": 1000, "retry_burst": 100})
    dep = _client(seg).dependency("dep")
    carried = []

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=8, jitter="decorrelated", base=0.01,
                                            cap=100))
    def fetch(self):
        carried.append((self.request.headers or {}).get(retryd.celery.BACKOFF_HEADER))
        raise ConnectionRefusedError()

    fetch.apply()
    # The message of each retry carries the backoff before it, and the next one is drawn from
    # U[base, 3 * that].
    assert carried[0] is None
    assert [c / 1e9 for c in carried[1:]] == pytest.approx(retries)
    previous = 0.01
    for wait in retries:
        assert 0.01 <= wait <= 3 * previous + 1e-9
        previous = max(wait, 0.01)


def test_retry_after_sets_the_countdown_and_a_longer_one_than_allowed_ends_the_retrying(
        make_segment, eager, retries, failures):
    seg = make_segment(dep={"min_calls": 1000, "retry_burst": 100})
    dep = _client(seg).dependency("dep")
    answers = iter([_http_error(503, "2"), _http_error(429, "120")])

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=5, base=0.01, retry_after_jitter=0.1,
                                            retry_after_max=30))
    def fetch(self):
        raise next(answers)

    result = _outcome(fetch.apply(), failures)
    # max(backoff, Retry-After + U[0, 0.1]); then a Retry-After of 120 s, over the 30 s
    # allowed: no retry, the task fails with the 429.
    assert len(retries) == 1
    assert 2.0 <= retries[0] <= 2.1
    assert isinstance(result, urllib.error.HTTPError)
    assert result.code == 429


def test_what_is_not_retryable_is_not_retried(make_segment, eager, failures):
    seg = make_segment(dep={"min_calls": 1, "failure_rate_threshold": 50, "open_for": "60s",
                            "open_for_max": "60s"})
    dep = _client(seg).dependency("dep")
    raised = iter([_http_error(404), celery.exceptions.Ignore(), _http_error(404)])
    calls = []

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=5))
    def fetch(self):
        calls.append(self.request.retries)
        raise next(raised)

    # A 404 is the caller's fault: terminal, and not the breaker's business (one call opens
    # this breaker at 50 % failures). Celery's own Ignore is reported as ignored too.
    assert isinstance(_outcome(fetch.apply(), failures), urllib.error.HTTPError)
    assert fetch.apply().state == "IGNORED"
    assert isinstance(_outcome(fetch.apply(), failures), urllib.error.HTTPError)
    assert calls == [0, 0, 0]
    assert seg.state("dep") == "closed"

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=5))
    def buggy(self):
        calls.append("buggy")
        raise KeyError("a bug, not the downstream")

    # An exception the policy does not map: one attempt, reported as a failure.
    assert isinstance(_outcome(buggy.apply(), failures), KeyError)
    assert calls[-1:] == ["buggy"] and len(calls) == 4
    assert seg.state("dep") == "open"


def test_a_non_idempotent_timeout_is_not_retried(make_segment, eager, failures):
    seg = make_segment(dep={"min_calls": 1000})
    dep = _client(seg).dependency("dep")
    calls = []

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=3, method="POST"))
    def charge(self):
        calls.append(self.request.retries)
        raise TimeoutError("no answer: charged or not?")

    assert isinstance(_outcome(charge.apply(), failures), TimeoutError)
    assert calls == [0]


def test_a_returned_response_is_inspected(make_segment, eager):
    seg = make_segment(dep={"min_calls": 1000, "retry_burst": 100})
    dep = _client(seg).dependency("dep")
    answers = iter([retryd.AttemptResult(value="busy", status=503),
                    retryd.AttemptResult(value="busy", status=503), {"charged": True}])

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=3, base=0.001))
    def fetch(self):
        return next(answers)

    assert fetch.apply().result == {"charged": True}

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency=dep,
                retryd_policy=retryd.Policy(max_attempts=2, base=0.001))
    def always_busy(self):
        return retryd.AttemptResult(value="busy", status=503)

    # Attempts spent: the last answer is the task's result, as the HTTP adapters return it.
    result = always_busy.apply()
    assert (result.state, result.result) == ("SUCCESS", "busy")


def test_a_direct_call_runs_once_as_a_first_attempt(make_segment, eager):
    seg = make_segment(dep={"min_calls": 1000, "retry_burst": 100})
    client = _client(seg)
    calls = []

    @eager.task(bind=True, base=retryd.celery.Task, retryd_dependency="dep",
                retryd_client=client, retryd_policy=retryd.Policy(max_attempts=3))
    def fetch(self, n):
        calls.append((n, self.request.retries, self.request.called_directly))
        raise ConnectionRefusedError()

    # The name is resolved on retryd_client. No worker, no retry: the error as raised.
    with pytest.raises(ConnectionRefusedError):
        fetch(7)
    assert calls == [(7, 0, True)]


def test_task_rejected_survives_celerys_serializers():
    rejected = retryd.celery.TaskRejected("budget_empty", "payments", 2)
    for copy in (pickle.loads(pickle.dumps(rejected)),
                 retryd.celery.TaskRejected(*json.loads(json.dumps(rejected.args)))):
        assert (copy.reason, copy.dependency, copy.attempt) == ("budget_empty", "payments", 2)
        assert str(copy) == str(rejected)


def test_what_the_task_cannot_honour_is_refused_when_celery_makes_it(eager):
    names = iter(range(100))

    def declare(**options):
        @eager.task(bind=True, base=retryd.celery.Task, name=f"case{next(names)}", **options)
        def fetch(self):
            return None
        return fetch.max_retries  # the task class is made on first use, or at finalization

    cases = [
        ({"retryd_policy": retryd.Policy(deadline=2.0)}, ValueError, "Policy.deadline"),
        ({"retryd_policy": retryd.Policy(attempt_timeout=1.0)}, ValueError,
         "Policy.attempt_timeout"),
        ({"retryd_policy": retryd.Policy(observer=print)}, ValueError, "Policy.observer"),
        ({"retryd_policy": retryd.Policy(jitter="random")}, ValueError, "Policy.jitter"),
        ({"retryd_policy": retryd.Policy(base=-1)}, ValueError, "Policy.base"),
        ({"retryd_policy": retryd.Policy(max_attempts=0)}, ValueError, "max_attempts"),
        ({"retryd_policy": {"max_attempts": 3}}, TypeError, "retryd.Policy"),
        ({"autoretry_for": (OSError,)}, ValueError, "autoretry_for"),
        ({"max_retries": 10}, ValueError, "max_retries"),
        ({"retryd_client": "retryd"}, TypeError, "retryd_client"),
        ({"retryd_dependency": 42}, TypeError, "retryd_dependency"),
    ]
    for options, error, words in cases:
        options.setdefault("retryd_dependency", "dep")
        with pytest.raises(error, match=words):
            declare(**options)
    assert declare(retryd_dependency="dep", max_retries=2) == 2

    @eager.task(bind=True, base=retryd.celery.Task, name="unset")
    def unset(self):
        return None

    with pytest.raises(ValueError, match="retryd_dependency is not set"):
        unset.apply(throw=True)


# ---- a prefork worker on a real broker ---------------------------------------------------------

def _redis_server():
    for path in (os.environ.get("RETRYD_REDIS_SERVER"), "/usr/bin/redis-server",
                 shutil.which("redis-server")):
        if path and os.access(path, os.X_OK):
            return path
    return None


class Worker:
    """The daemon, redis-server, the downstream, and `celery worker` serving celery_app."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.hold_dir = tmp / "hold"
        self.hold_dir.mkdir()
        self.daemon = Daemon(tmp, f"retryd-pytest-celery-{os.getpid()}")
        self.downstream = Downstream()
        self.redis_proc = self.proc = self.redis = None
        self._logs = []
        self._records = []

    def _log(self, name):
        f = open(self.tmp / name, "w")
        self._logs.append(f)
        return f

    def start(self, daemon_binary, redis_server):
        self.daemon.start(daemon_binary)
        sock = self.tmp / "redis.sock"
        # Not under the sanitizer runtime the tests may preload for libretryd: redis-server
        # does not load it.
        redis_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.redis_proc = subprocess.Popen(
            [redis_server, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.tmp)],
            env=redis_env, stdout=self._log("redis.log"), stderr=subprocess.STDOUT)
        self.redis = redis.Redis(unix_socket_path=str(sock))
        poll(self._redis_up, "redis-server to answer")
        broker = f"redis+socket://{sock}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY")}
        env.update({
            "RETRYD_SEGMENT": self.daemon.segment,
            "RETRYD_LIBRARY": os.path.abspath(os.environ.get("RETRYD_LIBRARY")
                                              or retryd.library_path()),
            "APP_BROKER": broker,
            "APP_DOWNSTREAM": self.downstream.url,
            "APP_HOLD_DIR": str(self.hold_dir),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings" / "python"),
                                           os.path.dirname(os.path.abspath(__file__))]),
        })
        env.pop("RETRYD_SOCKET", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool", "prefork",
             "--concurrency", str(POOL), "--loglevel", "WARNING", "--without-heartbeat",
             "--without-gossip", "--without-mingle", "-n", f"retryd-test-{os.getpid()}@%h"],
            cwd=self.tmp, env=env, stdout=self._log("celery.log"), stderr=subprocess.STDOUT)
        # Sends only: the worker stores results, this side reads them from Redis.
        self.app = celery.Celery("retryd_test_client", broker=broker, set_as_current=False)
        self.app.conf.update(task_serializer="json", accept_content=["json"])
        self.pool()

    def _redis_up(self):
        if self.redis_proc.poll() is not None:
            pytest.fail("redis-server exited: " + (self.tmp / "redis.log").read_text())
        try:
            return self.redis.ping()
        except redis.exceptions.ConnectionError:
            return False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def pool(self):
        """The pool processes' pids, once the worker runs all of them (it replaces one that
        died)."""
        def ready():
            if not self.alive():
                pytest.fail("celery exited: " + (self.tmp / "celery.log").read_text())
            kids = children(self.proc.pid)
            return kids if len(kids) == POOL else None
        return poll(ready, f"{POOL} pool processes")

    def submit(self, task, n, *args):
        """Sends `n` tasks; returns their ids."""
        return [self.app.send_task(f"celery_app.{task}", args=args).id for _ in range(n)]

    def records(self):
        """Every execution recorded so far, in order."""
        fresh = self.redis.lrange("executions", len(self._records), -1)
        self._records.extend(json.loads(r) for r in fresh)
        return self._records

    def finals(self, ids):
        """{id: the record of its last execution} of those of `ids` that have ended."""
        wanted = set(ids)
        return {r["id"]: r for r in self.records()
                if r["id"] in wanted and r["state"] in ("SUCCESS", "FAILURE")}

    def run(self, task, n, *args):
        """Sends `n` tasks and waits for them to end; returns their last executions' records."""
        ids = self.submit(task, n, *args)
        if not self.alive():
            pytest.fail("celery exited: " + (self.tmp / "celery.log").read_text())
        done = poll(lambda: (lambda f: f if len(f) == n else None)(self.finals(ids)),
                    f"{n} {task} tasks to end", interval=0.02)
        return [done[i] for i in ids]

    def executions(self, ids):
        wanted = set(ids)
        return [r for r in self.records() if r["id"] in wanted]

    def stored_exception(self, task_id):
        """The exception the worker stored as the task's result, read back from Redis as a
        client of the result backend reads it."""
        meta = json.loads(self.redis.get(f"celery-task-meta-{task_id}"))
        assert meta["status"] == "FAILURE", meta
        return meta["result"], self.app.backend.exception_to_python(meta["result"])

    def stop(self):
        (self.hold_dir / "release").touch()
        self.downstream.release()
        stop_process(self.proc)
        stop_process(self.redis_proc)
        self.daemon.stop()
        self.downstream.close()
        for f in self._logs:
            f.close()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    daemon_binary = require_daemon()
    redis_server = _redis_server()
    if redis_server is None:
        pytest.skip("redis-server is not installed (Debian package redis-server)")
    w = Worker(tmp_path_factory.mktemp("celery"))
    try:
        w.start(daemon_binary, redis_server)
        yield w
    finally:
        w.stop()


def registered(segment):
    """The live entries of `retryctl workers` (a process has one per Client it opened)."""
    return [w for w in retryctl_json(segment, "workers")["workers"] if w["state"] == "live"]


def test_pool_processes_share_one_breaker(worker):
    pool = worker.pool()
    worker.downstream.set("breaker", status=503)
    done = []

    def every_process_refused():
        done.extend(worker.run("breaker", 2 * POOL))
        return pool <= {r["pid"] for r in done if r.get("rejected") == "open"}

    poll(every_process_refused, "every pool process to find the breaker open", interval=0)
    sent = [r for r in done if "rejected" not in r]
    refused = [r for r in done if "rejected" in r]
    assert all(r["state"] == "FAILURE" for r in done)
    assert all(r["error"] == "HTTPError" for r in sent)
    assert {r["rejected"] for r in refused} == {"open"}
    # The pool's processes failed together: the 8 failures that tripped it came from more
    # than one, and the downstream saw exactly the attempts the host admitted.
    assert len({r["pid"] for r in sent}) > 1
    status = worker.daemon.dep("breaker")
    assert status["breaker"]["state"] == "open"
    counters = status["counters"]
    assert counters["opened"] == 1
    assert counters["failures"] == len(sent) == worker.downstream.count("breaker") >= 8
    assert counters["first_attempts"] == len(sent)
    assert counters["rejected_open"] == len(refused)
    # Every pool process is a registered process of its own, not its parent's.
    entries = [e for e in registered(worker.daemon.segment) if e["pid"] in pool]
    assert {e["pid"] for e in entries} == pool
    assert len({e["slot"] for e in entries}) == len(entries)
    # The refusal is the task's result, whole, through the result backend's JSON.
    stored, exc = worker.stored_exception(refused[0]["id"])
    assert (stored["exc_type"], stored["exc_module"]) == ("TaskRejected", "retryd.celery")
    assert isinstance(exc, retryd.celery.TaskRejected)
    assert (exc.reason, exc.dependency, exc.attempt) == ("open", "breaker", 0)


def test_pool_processes_share_one_retry_budget(worker):
    pool = worker.pool()
    worker.downstream.set("budget", status=503)
    done = []

    def every_process_denied():
        done.extend(worker.run("budget", POOL))
        return pool <= {r["pid"] for r in done if r.get("rejected") == "budget_empty"}

    poll(every_process_denied, "every pool process to find the retry budget empty",
         interval=0)
    executions = worker.executions([r["id"] for r in done])
    admitted = [r for r in executions if "rejected" not in r]
    # Four tokens for the host, no refill: four retries in all, whichever processes ran them,
    # and the downstream received each task's first attempt and those four retries.
    retried = [r for r in admitted if r["attempt"] > 0]
    assert len(retried) == 4
    assert worker.downstream.count("budget") == len(done) + 4
    assert all(r.get("rejected") == "budget_empty" and r["attempt"] > 0 for r in done)
    status = worker.daemon.dep("budget")
    assert status["retries"]["granted"] == 4
    assert status["retries"]["denied"] == len(done)
    assert status["counters"]["first_attempts"] == len(done)
    assert status["retry_budget"]["tokens_available"] < 1
    # Each retry waited the policy's backoff (equal jitter, base 20 ms, cap 80 ms): Celery's
    # countdown, an ETA on the retry's message, which carries the backoff on.
    countdowns = {}
    for r in executions:
        if r["state"] == "RETRY":
            exp = min(0.08, 0.02 * 2 ** r["attempt"])
            assert exp / 2 <= r["countdown"] <= exp, r
            countdowns[(r["id"], r["attempt"])] = r["countdown"]
    assert len(set(countdowns.values())) == len(countdowns), "the same wait drawn twice"
    for r in executions:
        if r["attempt"] > 0:
            assert r["eta"] is not None, r
            assert r["backoff_ns"] / 1e9 == pytest.approx(countdowns[(r["id"], r["attempt"] - 1)])


def test_one_probe_after_recovery(worker):
    pool = worker.pool()
    worker.downstream.set("probe", status=503)

    def opened():
        worker.run("probe", POOL)
        return worker.daemon.dep("probe")["breaker"]["state"] == "open"

    poll(opened, "the probe breaker to open", interval=0)
    # Every task has ended: nothing is in flight, and nothing is admitted until more are sent.
    status = worker.daemon.dep("probe")
    assert status["breaker"]["probes_in_flight"] == 0
    before = status["counters"]
    sent_before = worker.downstream.count("probe")
    # The downstream is back, and holds each request it gets until released.
    worker.downstream.set("probe", status=200, hold=True)
    pending, busy = set(), set()

    def probe_out_and_others_refused():
        pending.update(worker.submit("probe", POOL))
        # Every task but a held one ends.
        poll(lambda: len(pending - set(worker.finals(pending))) <= worker.downstream.held("probe"),
             "the tasks that are not held to end", interval=0.02)
        finals = worker.finals(pending)
        busy.update(r["pid"] for r in finals.values() if r.get("rejected") == "half_open_busy")
        pending.difference_update(finals)
        return worker.downstream.held("probe") >= 1 and len(busy) >= POOL - 1

    poll(probe_out_and_others_refused,
         "the probe to reach the downstream and the other processes to be refused",
         interval=0)
    # The open period ended with four processes taking tasks, and one request went out.
    assert worker.downstream.count("probe") - sent_before == 1
    assert worker.downstream.held("probe") == 1
    status = worker.daemon.dep("probe")
    assert status["breaker"]["state"] == "half-open"
    assert status["breaker"]["probes_in_flight"] == 1
    assert len(pending) == 1

    worker.downstream.release()
    probe = poll(lambda: worker.finals(pending), "the probe task to end")
    (record,) = probe.values()
    assert record["state"] == "SUCCESS"
    assert record["pid"] not in busy
    assert busy | {record["pid"]} == pool
    status = poll(lambda: (lambda s: s if s["breaker"]["state"] == "closed" else None)(
        worker.daemon.dep("probe")), "the probe breaker to close")
    after = status["counters"]
    assert after["probes_granted"] - before["probes_granted"] == 1
    assert after["closed"] - before["closed"] == 1
    assert worker.downstream.count("probe") - sent_before == 1
    # And every process is served again.
    served = set()

    def every_process_served():
        served.update(r["pid"] for r in worker.run("probe", 2 * POOL) if r["state"] == "SUCCESS")
        return pool <= served

    poll(every_process_served, "every pool process to succeed again", interval=0)


def test_killed_pool_process_gives_its_lease_back(worker):
    pool = worker.pool()
    worker.submit("hold", 1, True)
    marker = poll(lambda: next(worker.hold_dir.glob("hold-*"), None),
                  "a pool process to hold the bulkhead lease")
    holder = int(marker.read_text())
    assert holder in pool
    segment = worker.daemon.segment

    def leases(pid):
        return sum(e["bulkhead_leases"] for e in registered(segment) if e["pid"] == pid)

    assert worker.daemon.dep("slow")["bulkhead"]["in_use"] == 1
    assert leases(holder) == 1
    # The host-wide bulkhead of one is full for every other process.
    (refused,) = worker.run("hold", 1, False)
    assert refused.get("rejected") == "bulkhead_full"
    assert refused["pid"] != holder
    reclaimed = worker.daemon.dep("slow")["counters"]["leases_reclaimed_dead"]

    os.kill(holder, signal.SIGKILL)
    poll(lambda: worker.daemon.dep("slow")["bulkhead"]["in_use"] == 0,
         "the daemon to free the dead process's lease")
    slow = worker.daemon.dep("slow")
    assert slow["counters"]["leases_reclaimed_dead"] == reclaimed + 1
    poll(lambda: all(e["pid"] != holder for e in registered(segment)),
         "the dead process to leave the registry")
    # The worker replaces the process, and the lease is there for any process to take.
    assert holder not in worker.pool()
    marker.unlink()
    (passed,) = worker.run("hold", 1, False)
    assert passed["state"] == "SUCCESS", passed
